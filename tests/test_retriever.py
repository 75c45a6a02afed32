"""The Retriever on its own: tiny DPR encoder, tiny knowledge bases, no generator."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rag_demo.config import BM25_SCALE, RetrievalConfig
from rag_demo.retrieval.corpus import Passage, make_kb
from rag_demo.retrieval.encoders import encoder_from_modules
from rag_demo.errors import InputError
from rag_demo.retrieval.retriever import Retriever
from rag_demo.retrieval.lexical import QUESTION_TERMS

QUESTION = "who wrote a farewell to arms"


@pytest.fixture(scope="module")
def encoder(tiny_parts):
    return encoder_from_modules("tiny-dpr", tiny_parts["q_enc"], tiny_parts["q_tok"], scale=3.0)


def _question_vector(encoder, question: str) -> torch.Tensor:
    return encoder.encode_questions([question])[0]  # (D,)


@pytest.mark.parametrize("index", ["flat", "hnsw"])  # HNSW over 6 vectors visits them all: exact
@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("question", [QUESTION, "the deepest lake in siberia"])
def test_dense_top_k_is_the_brute_force_inner_products(encoder, tiny_kb, question, k, index):
    retrieval = Retriever(encoder=encoder, kbs={"tiny": tiny_kb}).retrieve(question, k=k, index=index)
    scores = torch.from_numpy(tiny_kb.embeddings) @ _question_vector(encoder, question)  # (N,)
    order = torch.argsort(scores, descending=True, stable=True)[:k]
    assert [p.id for p in retrieval.passages] == order.tolist()
    assert [p.score for p in retrieval.passages] == pytest.approx(scores[order].tolist(), abs=1e-5)
    assert [p.rank for p in retrieval.passages] == list(range(1, k + 1))
    assert (retrieval.retriever, retrieval.kb, retrieval.scale) == ("dense", "tiny", 3.0)
    assert (retrieval.index_recall is None) == (index == "flat")
    # the exact search behind an approximate index's recall is timed apart from its search, as the Index tab times it
    assert ("recall check" in retrieval.timings_ms) == (index != "flat") == (retrieval.recall_ms > 0)


def test_p_z_given_x_is_the_softmax_of_the_top_k_scores(encoder, tiny_kb):
    retrieval = Retriever(encoder=encoder, kbs={"tiny": tiny_kb}).retrieve(QUESTION, k=4)
    scores = torch.tensor([p.score for p in retrieval.passages])
    expected = torch.softmax(3.0 * scores, dim=0)  # renormalized over the top 4 only, at the encoder's scale
    assert retrieval.doc_lp.shape == (4,)
    assert retrieval.doc_lp.exp().tolist() == pytest.approx(expected.tolist(), abs=1e-6)
    assert [p.prob for p in retrieval.passages] == pytest.approx(expected.tolist(), abs=1e-6)
    assert [p.logit for p in retrieval.passages] == pytest.approx((3.0 * scores).tolist(), abs=1e-5)
    assert retrieval.encode_ms > 0 and retrieval.search_ms > 0


@pytest.mark.parametrize("typed", [QUESTION + "?", QUESTION + " ?! ", QUESTION + "."])
def test_a_question_retrieves_the_same_whatever_marks_end_it(encoder, tiny_kb, typed):
    retriever = Retriever(encoder=encoder, kbs={"tiny": tiny_kb})
    plain, marked = retriever.retrieve(QUESTION, k=6), retriever.retrieve(typed, k=6)
    assert [p.id for p in marked.passages] == [p.id for p in plain.passages]
    assert [p.logit for p in marked.passages] == pytest.approx([p.logit for p in plain.passages], abs=1e-6)
    with torch.inference_mode():  # read as typed, the marks move the question's vector: the rule is what holds it
        as_typed = encoder.vectors(encoder.question_model, encoder.tokenizer, [typed])[0]
    assert not torch.allclose(as_typed, _question_vector(encoder, QUESTION), atol=1e-4)


def test_named_rows_are_weighed_among_themselves(encoder, tiny_kb):
    retriever = Retriever(encoder=encoder, kbs={"tiny": tiny_kb})
    assert [p.prob for p in retriever.retrieve(QUESTION, rows=[4]).passages] == [1.0]  # one gold passage: p(z|x) = 1
    both = retriever.retrieve(QUESTION, rows=[2, 5])
    assert {p.id for p in both.passages} == {2, 5} and sum(p.prob for p in both.passages) == pytest.approx(1.0)
    with pytest.raises(InputError, match="rows must lie in"):
        retriever.retrieve(QUESTION, rows=[6])


# -- bm25 and hybrid on a hand-made knowledge base --------------------------------------------------

STAMPS = [
    Passage("Stamps", "The Penny Black was the first postage stamp."),
    Passage("Lakes", "Baikal is the deepest lake on Earth."),
    Passage("Coins", "A penny is a coin."),
]


def _hand_made_kb(encoder, question: str, dense: list[float]):
    """STAMPS with vectors placed so that each passage's inner product with the question is `dense`."""
    xq = _question_vector(encoder, question).numpy()
    vectors = np.outer(dense, xq / (xq @ xq)).astype(np.float32)  # (3, D): d(z)ᵀq(x) = dense[z]
    return make_kb("stamps", STAMPS, vectors)


def test_bm25_ranks_by_shared_words_and_says_when_none_are_left(encoder):
    question = "penny black stamp"
    kb = _hand_made_kb(encoder, question, [0.0, 1.0, 0.5])
    retrieval = Retriever(encoder=encoder, kbs={"stamps": kb}).retrieve(question, k=3, retriever="bm25")
    # three of the question's words against one, and the lake passage shares none
    assert [p.title for p in retrieval.passages] == ["Stamps", "Coins", "Lakes"]
    assert retrieval.passages[0].score > retrieval.passages[1].score > retrieval.passages[2].score == 0
    bm25 = torch.tensor([p.score for p in retrieval.passages])
    assert retrieval.doc_lp.exp().tolist() == pytest.approx(torch.softmax(BM25_SCALE * bm25, 0).tolist(), abs=1e-6)
    assert (retrieval.retriever, retrieval.scale, retrieval.encode_ms) == ("bm25", BM25_SCALE, 0.0)
    assert retrieval.notices == ("only 2 passages share a word with the question; the last of the top 3 scores 0 "
                                 "(ties keep the knowledge base's order)",)


@pytest.mark.parametrize("index", ["flat", "hnsw"])
def test_hybrid_adds_weighted_bm25_to_the_dense_logit(encoder, index):
    question = "penny black stamp"
    kb = _hand_made_kb(encoder, question, [0.0, 1.0, 0.5])  # dense alone: Lakes, Coins, Stamps
    quiet = Retriever(encoder=encoder, kbs={"stamps": kb}, config=RetrievalConfig(lexical_weight=1e-6))
    loud = Retriever(encoder=encoder, kbs={"stamps": kb}, config=RetrievalConfig(lexical_weight=100.0))
    assert [p.title for p in quiet.retrieve(question, k=3, index=index, retriever="dense").passages] == ["Lakes", "Coins", "Stamps"]
    assert [p.title for p in quiet.retrieve(question, k=3, index=index).passages] == ["Lakes", "Coins", "Stamps"]
    hybrid = loud.retrieve(question, k=3, index=index)
    assert hybrid.retriever == "hybrid" and [p.title for p in hybrid.passages] == ["Stamps", "Coins", "Lakes"]
    for p in hybrid.passages:
        assert p.score == pytest.approx([0.0, 1.0, 0.5][p.id], abs=1e-5)
        assert p.logit == pytest.approx(3.0 * p.score + 100.0 * p.lexical, rel=1e-5)
    assert hybrid.doc_lp.exp().tolist() == pytest.approx(torch.softmax(torch.tensor([p.logit for p in hybrid.passages]), 0).tolist())
    assert not hybrid.notices


def test_hybrid_says_when_no_passage_shares_a_word_with_the_question(encoder):
    kb = _hand_made_kb(encoder, "zzz qqq", [0.0, 1.0, 0.5])
    retriever = Retriever(encoder=encoder, kbs={"stamps": kb}, config=RetrievalConfig(lexical_weight=1.0))
    nonsense = retriever.retrieve("zzz qqq", k=2)
    assert [p.title for p in nonsense.passages] == ["Lakes", "Coins"] and all(p.lexical == 0 for p in nonsense.passages)
    assert nonsense.notices == ("no passage shares a word with the question: BM25 adds nothing, and the passages are "
                                "the dense retriever's nearest, however far",)
    assert not retriever.retrieve("zzz penny", k=2).notices  # one shared word is enough to say nothing


@pytest.mark.parametrize("retriever", ["hybrid", "bm25"])
def test_a_long_pasted_question_is_scored_as_an_ordinary_one_and_says_so(encoder, retriever):
    kb = _hand_made_kb(encoder, "penny black stamp", [0.0, 1.0, 0.5])
    engine = Retriever(encoder=encoder, kbs={"stamps": kb}, config=RetrievalConfig(lexical_weight=1.0))
    short = engine.retrieve("penny black stamp", k=3, retriever=retriever, index="flat")
    pasted = engine.retrieve(" ".join(["penny black stamp"] * 20), k=3, retriever=retriever, index="flat")  # 60 terms
    lexical = {p.id: p.lexical for p in short.passages}
    for p in pasted.passages:  # BM25 of the mean term, times QUESTION_TERMS: 16/60 of twenty repeats, 16/3 of one
        assert p.lexical == pytest.approx(lexical[p.id] * 20 * QUESTION_TERMS / 60, rel=1e-5)
    said = f"scored it as a question of {QUESTION_TERMS}"
    assert not any(said in notice for notice in short.notices) and any(said in notice for notice in pasted.notices)


def test_retriever_choice_and_options_are_checked(encoder, tiny_kb):
    plain = Retriever(encoder=encoder, kbs={"tiny": tiny_kb})
    assert plain.retrievers == ("dense", "bm25") and plain.resolve_retriever(None) == "dense"
    for kwargs, message in [({"retriever": "hybrid"}, "lexical weight"), ({"retriever": "sparse"}, "unknown retriever"),
                            ({"k": 7}, "larger than the knowledge base"), ({"k": 0}, "at least 1"),
                            ({"index": "annoy"}, "unknown index"), ({"kb": "nope"}, "unknown knowledge base")]:
        with pytest.raises(InputError, match=message):
            plain.retrieve(QUESTION, **kwargs)
    with pytest.raises(InputError, match="0 or more"):
        Retriever(encoder=encoder, kbs={"tiny": tiny_kb}, config=RetrievalConfig(lexical_weight=-1.0))


# -- what is kept in memory ---------------------------------------------------------------------------


def _own_kb(encoder, seed: int):
    """A visitor's own KB: passed as an object, never registered."""
    vectors = np.random.default_rng(seed).standard_normal((3, encoder.dim)).astype(np.float32)
    return make_kb(f"mine-{seed}", STAMPS, vectors)


def test_visitors_indexes_are_kept_least_recently_used_and_registered_ones_for_good(encoder, tiny_kb):
    retriever = Retriever(encoder=encoder, kbs={"tiny": tiny_kb}, private_slots=2)
    a, b, c = (_own_kb(encoder, seed) for seed in range(3))
    retriever.search_index("tiny", "flat")
    retriever.search_index(a, "flat")
    retriever.search_index(b, "flat")
    retriever.retrieve(QUESTION, kb=a, k=1)  # a is used again, so b is now the least recent
    retriever.search_index(c, "flat")
    assert retriever.held() == {(tiny_kb.fingerprint, "flat"), (a.fingerprint, "flat"), (c.fingerprint, "flat")}
    retriever.release_kb(a)
    retriever.release_kb(tiny_kb)  # a registered KB is never released
    assert retriever.held() == {(tiny_kb.fingerprint, "flat"), (c.fingerprint, "flat")}


def test_warm_up_loads_the_exact_and_bm25_indexes_of_every_registered_kb(encoder, tiny_kb):
    other = _own_kb(encoder, 7)
    retriever = Retriever(encoder=encoder, kbs={"tiny": tiny_kb, "other": other})
    assert not retriever.held()
    retriever.warm_up()
    assert retriever.held() == {(kb.fingerprint, kind) for kb in (tiny_kb, other) for kind in ("flat", "bm25")}


def test_a_kb_without_vectors_yet_is_served_by_bm25_and_says_so(encoder, tiny_kb):
    """A first start serves its KBs with BM25 while they are embedded: dense and hybrid asks fall
    back to BM25 with a notice, and what needs vectors says they are still being built."""
    from rag_demo.retrieval.corpus import text_only_kb

    passages = [tiny_kb.passage(row) for row in range(len(tiny_kb))]
    text = text_only_kb("tiny", passages)
    assert not text.has_vectors and tiny_kb.has_vectors and text.fingerprint != tiny_kb.fingerprint
    retriever = Retriever(encoder=encoder, kbs={"tiny": text}, config=RetrievalConfig(lexical_weight=0.5))
    plain = Retriever(encoder=encoder, kbs={"tiny": tiny_kb}).retrieve(QUESTION, k=3, retriever="bm25")
    for asked in ("dense", "hybrid", None):
        retrieval = retriever.retrieve(QUESTION, k=3, retriever=asked)
        assert retrieval.retriever == "bm25" and [p.id for p in retrieval.passages] == [p.id for p in plain.passages]
        assert "still being built" in retrieval.notices[0]
    assert retriever.retrieve(QUESTION, k=3, retriever="bm25").notices == plain.notices
    comparison = retriever.compare(QUESTION, k=3)
    assert [r.retriever for r in comparison.rankings] == ["bm25"]
    for needs_vectors in (lambda: retriever.index_reports("tiny"), lambda: retriever.search_index("tiny", "hnsw")):
        with pytest.raises(InputError, match="dense vectors are still being built"):
            needs_vectors()
    retriever.warm_up()  # BM25 only: nothing to load for the vectors
    assert {what for _, what in retriever.held()} <= {"bm25", "gold"} and (text.fingerprint, "bm25") in retriever.held()


def test_an_index_build_reports_its_progress_once(encoder, tiny_kb):
    retriever = Retriever(encoder=encoder, kbs={"tiny": tiny_kb})
    heard = []
    retriever.search_index("tiny", "ivfpq", progress=lambda stage, done, total: heard.append((stage, done, total)))
    n = len(tiny_kb)
    assert heard[0] == ("building the ivfpq index of tiny", 0, n) and heard[-1] == ("building the ivfpq index of tiny", n, n)
    retriever.search_index("tiny", "ivfpq", progress=lambda *args: heard.append(args))  # held: nothing is built
    assert len(heard) == 2


def test_a_large_kbs_approximate_index_is_built_by_the_command_not_in_an_ask(encoder, tiny_kb, tmp_path, monkeypatch):
    from rag_demo.retrieval import retriever as retriever_module
    from rag_demo.cli import main
    from rag_demo.retrieval.corpus import load_kb, save_kb

    folder = save_kb(tiny_kb, tmp_path / "big", vectors="float16")
    monkeypatch.setattr(retriever_module, "BUILD_WHILE_SERVING_MAX_ROWS", len(tiny_kb) - 1)  # "large" from here
    retriever = Retriever(encoder=encoder, kbs={"big": load_kb(folder, name="big")})
    with pytest.raises(InputError, match=f"build-index {folder} --kind hnsw") as refused:
        retriever.retrieve(QUESTION, kb="big", k=2, index="hnsw")
    assert "Exact (flat) search works meanwhile" in str(refused.value) and not (folder / "indexes").exists()
    measured = []
    monkeypatch.setattr(retriever_module, "measure", lambda *args, **kwargs: measured.append(args))
    with pytest.raises(InputError, match="build-index"):
        retriever.index_reports("big")
    assert measured == []  # refused before measuring anything
    assert len(retriever.retrieve(QUESTION, kb="big", k=2, index="flat").passages) == 2
    assert main(["build-index", str(folder), "--kind", "hnsw"]) == 0
    assert retriever.retrieve(QUESTION, kb="big", k=2, index="hnsw").passages  # saved once: now served


@pytest.mark.parametrize("k", [1, 3, 10])
def test_top_k_over_many_candidates_orders_as_a_full_stable_sort(tiny_kb, k):
    from rag_demo.retrieval.retriever import top_k

    n = len(tiny_kb)
    rng = np.random.default_rng(k)
    for _ in range(20):
        c = 500  # candidates; rows repeat (the tiny KB is small), ties are many: logits from a few values
        ids = rng.integers(0, n, size=c)
        logits = torch.from_numpy(rng.integers(0, 6, size=c).astype(np.float32))
        scores, lexical = logits / 2, torch.zeros(c)
        passages, doc_lp = top_k(tiny_kb, ids, scores, lexical, logits, k)
        want = torch.argsort(logits, descending=True, stable=True)[:k]
        assert [p.id for p in passages] == [int(ids[i]) for i in want.tolist()]
        assert [p.logit for p in passages] == logits[want].tolist() and doc_lp.shape == (k,)


class WorstRows:
    """An approximate index at its worst: the rows with the lowest inner products, worst first."""

    def __init__(self, vectors: np.ndarray):
        self.vectors = vectors

    def search(self, query, depth):
        order = np.argsort(query @ self.vectors.T, axis=1)[:, :depth]
        return None, order


def test_hybrid_recall_is_the_share_of_exact_hybrid_search_among_the_passages_shown(encoder, tiny_kb, monkeypatch):
    retriever = Retriever(encoder=encoder, kbs={"tiny": tiny_kb}, config=RetrievalConfig(lexical_weight=2.0, candidates=2))
    exact = retriever.retrieve(QUESTION, k=2, retriever="hybrid")  # the flat index: every passage scored
    flat_search = retriever.search_index
    monkeypatch.setattr(retriever, "search_index", lambda kb=None, kind="flat", **kw: (
        flat_search(kb, kind, **kw) if kind == "flat" else WorstRows(tiny_kb.embeddings)))
    shown = retriever.retrieve(QUESTION, k=2, index="hnsw", retriever="hybrid")
    overlap = {p.id for p in shown.passages} & {p.id for p in exact.passages}
    assert shown.index_recall == len(overlap) / 2
    assert 0 < shown.index_recall  # BM25's best rows still reach the passages shown; the dense search alone found none


def test_each_passage_says_which_part_of_its_article_it_is(encoder):
    passages = [Passage("Moon", "The Moon orbits the Earth."), Passage("Moon", "It has no air."),
                Passage("Mars", "Mars is red."), Passage("", "An untitled note."), Passage("", "Another note."),
                Passage("Moon", "A later Moon passage, apart from the others.")]
    vectors = np.random.default_rng(0).normal(size=(len(passages), encoder.dim)).astype(np.float32)
    kb = make_kb("parts", passages, vectors)
    retrieval = Retriever(encoder=encoder, kbs={"parts": kb}).retrieve("moon", k=len(passages), retriever="dense")
    # counted here from the rows: neighbours with the same non-empty title are one article
    expected = {0: (1, 2), 1: (2, 2), 2: (0, 0), 3: (0, 0), 4: (0, 0), 5: (0, 0)}
    assert {p.id: (p.part, p.parts) for p in retrieval.passages} == expected
