import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest

from rag_demo.retrieval.lexical import QUESTION_TERMS, LexicalIndex, terms

TEXTS = [
    "Mozart composed The Magic Flute in 1791 in Vienna.",
    "The Penny Black stamp was issued in 1840; the penny post followed.",
    "Lake Baikal in Siberia is the deepest lake, deeper than any other lake.",
    "",
    "Flute and piccolo: the flute family.",
]


def bm25_by_formula(texts, question, k1, b):
    docs = [terms(t) for t in texts]
    mean = sum(map(len, docs)) / len(docs)
    out = []
    for doc in docs:
        tf = Counter(doc)
        score = 0.0
        for word in terms(question):
            df = sum(word in d for d in docs)
            if df == 0 or word not in tf:
                continue
            idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
            score += idf * tf[word] * (k1 + 1) / (tf[word] + k1 * (1 - b + b * len(doc) / mean))
        out.append(score)
    return np.array(out)


@pytest.mark.parametrize("k1,b", [(0.9, 0.4), (1.2, 0.75), (2.0, 0.0)])
@pytest.mark.parametrize("question", ["who composed the magic flute", "deepest lake lake", "penny 1840 flute", "nothing matches zzz"])
def test_scores_equal_the_bm25_formula(question, k1, b):
    index = LexicalIndex.build(TEXTS, k1=k1, b=b)
    np.testing.assert_allclose(index.scores(question), bm25_by_formula(TEXTS, question, k1, b), rtol=1e-5, atol=1e-6)


def test_a_question_past_the_term_limit_scores_as_one_of_that_many_terms():
    index = LexicalIndex.build(TEXTS)
    question = "magic flute deepest lake"  # 4 terms
    for repeats in (1, QUESTION_TERMS // 4):  # up to the limit, the plain formula
        np.testing.assert_allclose(index.scores(" ".join([question] * repeats)),
                                   bm25_by_formula(TEXTS, " ".join([question] * repeats), 0.9, 0.4), rtol=1e-5, atol=1e-6)
    pasted = " ".join([question] * 20)  # 80 terms: the mean term, QUESTION_TERMS times
    np.testing.assert_allclose(index.scores(pasted), bm25_by_formula(TEXTS, question, 0.9, 0.4) * QUESTION_TERMS / 4,
                               rtol=1e-5, atol=1e-6)


def test_top_orders_by_score_and_drops_non_matching():
    index = LexicalIndex.build(TEXTS)
    top = index.top("magic flute", 5)
    scores = index.scores("magic flute")
    assert top.tolist() == [0, 4]  # the empty passage and the unrelated ones score 0 and are left out
    assert scores[0] > scores[4] > 0
    assert index.top("the of who", 3).tolist() == []  # stopwords only
    assert index.top("flute", 0).tolist() == []


def test_words_are_unicode_and_case_blind():
    index = LexicalIndex.build(["Zürich liegt am Zürichsee.", "Πλάτων ήταν φιλόσοφος."])
    assert index.top("ZÜRICH", 2).tolist() == [0]
    assert index.top("πλάτων", 2).tolist() == [1]


def test_empty_knowledge_base():
    index = LexicalIndex.build([])
    assert index.scores("anything").shape == (0,)
    assert index.top("anything", 3).tolist() == []


# -- the streamed build, saved and loaded ------------------------------------------------------------


def one_pass_build(texts, k1=0.9, b=0.4):
    """The build as it was before it streamed: every posting in Python lists, then one stable sort (the oracle)."""
    vocabulary, term_ids, doc_ids, counts = {}, [], [], []
    lengths = np.zeros(len(texts), dtype=np.float32)
    for row, text in enumerate(texts):
        words = terms(text)
        lengths[row] = len(words)
        for word, count in Counter(words).items():
            term_ids.append(vocabulary.setdefault(word, len(vocabulary)))
            doc_ids.append(row)
            counts.append(count)
    term_ids = np.asarray(term_ids, dtype=np.int64)
    order = np.argsort(term_ids, kind="stable")
    term_ids = term_ids[order]
    docs = np.asarray(doc_ids, dtype=np.int32)[order]
    tf = np.asarray(counts, dtype=np.float32)[order]
    frequency = np.bincount(term_ids, minlength=len(vocabulary)).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(frequency)]).astype(np.int64)
    n = max(len(texts), 1)
    idf = np.log1p((n - frequency + 0.5) / (frequency + 0.5))
    mean_length = max(float(lengths.mean()) if len(texts) else 0.0, 1.0)
    norm = k1 * (1 - b + b * lengths[docs] / mean_length)
    weights = (idf[term_ids] * tf * (k1 + 1) / (tf + norm)).astype(np.float32)
    return vocabulary, offsets, docs, weights


POOL = "mozart flute magic vienna 1791 penny black stamp lake baikal the of in Zürich Πλάτων deep deeper x y z".split()


def random_texts(seed, n):
    """n texts of 0 to 30 words from a small pool (repeats, stopwords, empty texts, mixed case and scripts)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, len(POOL) + 1)  # Zipf-like: a few words in most texts, most in a few
    return [" ".join(rng.choice(POOL, size=rng.integers(0, 31), p=weights / weights.sum())) for _ in range(n)]


def assert_same_index(index, vocabulary, offsets, docs, weights):
    assert dict(index.vocabulary) == vocabulary
    np.testing.assert_array_equal(index.offsets, offsets)
    np.testing.assert_array_equal(index.docs, docs)
    np.testing.assert_array_equal(index.weights, weights)  # bit for bit, not within a tolerance
    assert (index.offsets.dtype, index.docs.dtype, index.weights.dtype) == (np.int64, np.int32, np.float32)


@pytest.mark.parametrize("on_disk", [False, True])
@pytest.mark.parametrize("chunk", [1, 2, 7, 40, 41, 1000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streamed_build_equals_the_one_pass_build(seed, chunk, on_disk, tmp_path):
    texts = random_texts(seed, 41)
    index = LexicalIndex.build(texts, chunk=chunk, scratch=tmp_path if on_disk else None)
    assert_same_index(index, *one_pass_build(texts))
    assert isinstance(index.docs, np.memmap) == on_disk
    assert sorted(p.name for p in tmp_path.iterdir()) == (["docs.npy", "weights.npy"] if on_disk else [])
    oracle = LexicalIndex(*one_pass_build(texts), size=len(texts))
    for question in ["mozart flute flute", "deep lake baikal", "Zürich πλάτων 1791", "the of", "absent"]:
        np.testing.assert_array_equal(index.scores(question), oracle.scores(question))


def test_terms_repeated_past_small_integer_ranges_keep_their_counts():
    texts = ["flute " * 300 + "lake", "flute " * 70_000, "lake " * 255 + "flute"]  # past uint8, past uint16
    index = LexicalIndex.build(texts, chunk=1)  # one passage a chunk: each chunk picks its own count type
    assert_same_index(index, *one_pass_build(texts))
    np.testing.assert_allclose(index.scores("flute lake"), bm25_by_formula(texts, "flute lake", 0.9, 0.4), rtol=1e-5)


def test_build_reports_progress_and_pairs_titles_as_zip_does():
    seen = []
    index = LexicalIndex.build(random_texts(3, 10), chunk=4, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(4, 10), (8, 10), (10, 10)] and index.size == 10
    titles, texts = ["Mozart", "Baikal"], ["magic flute", "deep lake", "an unpaired text"]
    paired = LexicalIndex.for_passages(titles, texts)
    assert paired.size == 2 and paired.top("mozart flute", 3).tolist() == [0]


def test_vocabulary_finds_every_term_and_nothing_else():
    texts = random_texts(4, 30)
    vocabulary = one_pass_build(texts)[0]
    index = LexicalIndex.build(texts)
    assert all(index.vocabulary[term] == term_id for term, term_id in vocabulary.items())
    assert list(index.vocabulary) == sorted(vocabulary) and len(index.vocabulary) == len(vocabulary)
    for absent in ["", "zz", "mozar", "mozartt", "ÿ", "\U0001f600"]:
        assert absent not in index.vocabulary
    assert index.query_terms("flute flute absent") == [vocabulary["flute"]] * 2


@pytest.mark.parametrize("mmap", [True, False])
def test_save_and_load_give_the_same_index(tmp_path, mmap):
    texts = random_texts(5, 60)
    built = LexicalIndex.build(texts, chunk=16)
    loaded = LexicalIndex.load(built.save(tmp_path / "bm25"), mmap=mmap)
    assert_same_index(loaded, *one_pass_build(texts))
    assert isinstance(loaded.docs, np.memmap) == mmap and loaded.size == 60
    for question in ["mozart flute", "penny black stamp 1791", "deeper deeper lake", "nothing"]:
        np.testing.assert_array_equal(loaded.scores(question), built.scores(question))
        np.testing.assert_array_equal(loaded.top(question, 5), built.top(question, 5))


def test_save_replaces_an_index_in_place(tmp_path):
    LexicalIndex.build(["magic flute"]).save(tmp_path / "bm25")
    LexicalIndex.build(["deep lake", "baikal"]).save(tmp_path / "bm25")
    assert LexicalIndex.load(tmp_path / "bm25").top("lake", 2).tolist() == [0]
    assert [p.name for p in tmp_path.iterdir()] == ["bm25"]  # no staging folder left behind


def test_empty_index_saves_and_loads(tmp_path):
    loaded = LexicalIndex.load(LexicalIndex.build([]).save(tmp_path / "bm25"))
    assert loaded.size == 0 and len(loaded.vocabulary) == 0 and loaded.scores("anything").shape == (0,)


@pytest.mark.parametrize("damage", ["missing", "truncated", "format"])
def test_a_damaged_saved_index_is_refused_with_the_fix(tmp_path, damage):
    import json

    from rag_demo.errors import KnowledgeBaseError

    folder = LexicalIndex.build(random_texts(6, 20)).save(tmp_path / "kb" / "bm25")
    if damage == "missing":
        (folder / "docs.npy").unlink()
    elif damage == "truncated":
        data = (folder / "weights.npy").read_bytes()
        (folder / "weights.npy").write_bytes(data[:-4])
    else:
        meta = json.loads((folder / "meta.json").read_text())
        (folder / "meta.json").write_text(json.dumps({**meta, "format": 0}))
    with pytest.raises(KnowledgeBaseError, match=f"build-bm25 {tmp_path / 'kb'}"):
        LexicalIndex.load(folder)


# -- a KB folder's BM25 --------------------------------------------------------------------------------


@pytest.fixture
def builds(monkeypatch):
    """Counts the builds `for_kb_folder` makes (a load is not one)."""
    from rag_demo.retrieval import lexical

    made = []
    real = lexical._build

    def counted(*args, **kwargs):
        made.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(lexical, "_build", counted)
    return made


def test_kb_folder_builds_once_then_loads_the_saved_index(tmp_path, builds):
    from rag_demo.retrieval.lexical import lexical_path

    titles, texts = [f"title {i}" for i in range(30)], random_texts(7, 30)
    first = LexicalIndex.for_kb_folder(tmp_path, titles, texts, fingerprint="abc")
    assert builds == [30] and lexical_path(tmp_path).is_dir() and isinstance(first.docs, np.memmap)
    assert [p.name for p in tmp_path.iterdir()] == ["bm25"]  # the scratch folder is gone
    again = LexicalIndex.for_kb_folder(tmp_path, titles, texts, fingerprint="abc")
    assert builds == [30] and isinstance(again.docs, np.memmap)
    oracle = LexicalIndex(*one_pass_build([f"{t} {x}" for t, x in zip(titles, texts)]), size=30)
    np.testing.assert_array_equal(again.scores("title 3 flute"), oracle.scores("title 3 flute"))


@pytest.mark.parametrize("change", ["fewer passages", "other text", "other vectors", "other constants", "damaged"])
def test_kb_folder_rebuilds_a_stale_saved_index(tmp_path, builds, change, caplog, monkeypatch):
    titles, texts = [f"title {i}" for i in range(30)], random_texts(8, 30)
    LexicalIndex.for_kb_folder(tmp_path, titles, texts, fingerprint="abc")
    fingerprint = "abc"
    if change == "fewer passages":
        titles, texts = titles[:29], texts[:29]
    elif change == "other text":
        texts = texts[:-1] + ["lake baikal, a new last passage"]
    elif change == "other vectors":
        fingerprint = "abd"
    elif change == "other constants":
        monkeypatch.setattr("rag_demo.retrieval.lexical.K1", 1.2)
    else:
        (tmp_path / "bm25" / "offsets.npy").write_bytes(b"not an array")
    with caplog.at_level("WARNING", logger="rag_demo.retrieval.lexical"):
        index = LexicalIndex.for_kb_folder(tmp_path, titles, texts, fingerprint=fingerprint)
    assert builds == [30, len(texts)] and "rebuilding it" in caplog.text
    LexicalIndex.for_kb_folder(tmp_path, titles, texts, fingerprint=fingerprint)
    assert builds == [30, len(texts)]  # the rebuilt one was saved in its place
    from rag_demo.retrieval import lexical

    oracle = LexicalIndex(*one_pass_build([f"{t} {x}" for t, x in zip(titles, texts)], k1=lexical.K1), size=len(texts))
    np.testing.assert_array_equal(index.scores("lake baikal"), oracle.scores("lake baikal"))


@pytest.mark.parametrize("fails", ["saving", "scratch files", "scratch folder"])
def test_kb_folder_that_cannot_be_written_still_answers(tmp_path, monkeypatch, caplog, fails):
    import tempfile

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    target = {"saving": (LexicalIndex, "save"), "scratch files": ("rag_demo.retrieval.lexical._stash",),
              "scratch folder": (tempfile, "mkdtemp")}[fails]
    monkeypatch.setattr(*target, full_disk)
    titles, texts = ["Mozart", "Baikal"], ["magic flute", "deep lake"]
    with caplog.at_level("WARNING", logger="rag_demo.retrieval.lexical"):
        index = LexicalIndex.for_kb_folder(tmp_path, titles, texts)
    assert "No space left" in caplog.text and list(tmp_path.iterdir()) == []
    assert_same_index(index, *one_pass_build(["Mozart magic flute", "Baikal deep lake"]))
    assert not isinstance(index.docs, np.memmap)  # nothing is left mapped from a folder that was removed


# -- the size limit --------------------------------------------------------------------------------------


def test_building_past_the_size_limit_is_refused_with_the_fix(tmp_path):
    from rag_demo.errors import IndexTooLargeError, KnowledgeBaseError

    texts = ["magic flute vienna", "deep lake", "penny black stamp"]  # 3 + 2 + 3 postings
    assert LexicalIndex.build(texts, max_postings=8).size == 3  # at the limit: built
    assert LexicalIndex.build(texts, max_postings=None).size == 3  # no limit
    with pytest.raises(IndexTooLargeError, match="bm25 and hybrid retrieval are off") as refused:
        LexicalIndex.build(texts, max_postings=7, chunk=1)
    assert isinstance(refused.value, KnowledgeBaseError) and "build-bm25 KB_FOLDER" in str(refused.value)
    with pytest.raises(IndexTooLargeError, match=f"build-bm25 {tmp_path}`"):
        LexicalIndex.for_kb_folder(tmp_path, ["", "", ""], texts, max_postings=7)
    assert not (tmp_path / "bm25").exists()


def test_the_limit_stops_the_build_early():
    from rag_demo.errors import IndexTooLargeError

    class Texts(Sequence):  # 500 passages that count how many were read
        def __len__(self):
            return 500

        def __getitem__(self, row):
            if row >= 500:
                raise IndexError(row)
            read.append(row)
            return "magic flute"

    read, seen = [], []
    with pytest.raises(IndexTooLargeError, match="about 1,000 postings"):  # 2 a passage
        LexicalIndex.for_passages([""] * 500, Texts(), max_postings=10, chunk=4,
                                  progress=lambda done, total: seen.append(done))
    assert seen == [4] and len(read) == 8  # the second chunk's 16 postings passed the limit; 492 passages never read
