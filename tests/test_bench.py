"""The speed benchmarks run end to end on tiny models, and their identity checks hold."""

from __future__ import annotations

import json

import pytest
import torch


def test_quick_bench_runs_and_outputs_are_identical(tmp_path, capsys):
    from benchmarks import speed

    out = tmp_path / "bench.json"
    assert speed.main(["--quick", "--skip", "memory", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["mismatches"] == []
    for section in ("stages", "indexes", "kb_build", "vs_transformers", "vs_plain_loop"):
        assert report[section], section
    for row in report["vs_transformers"] + report["vs_plain_loop"]:
        done, total = row["identical"].split("/")
        assert done == total and int(total) > 0
    stages = {(row["k"], row["stage"]) for row in report["stages"]}
    assert (2, "search hnsw") in stages and (3, "generate RAG-Sequence fast") in stages
    synthetic = [row for row in report["indexes"] if row["data"].startswith("synthetic")]
    assert [row["index"] for row in synthetic] == ["flat", "hnsw", "ivfpq"] and synthetic[0]["recall@10"] == 1.0
    printed = capsys.readouterr().out
    assert "| variant | model |" in printed and "all identity checks passed" in printed


def test_plain_loop_stops_at_the_stop_tokens(tmp_path):
    from benchmarks import speed
    from benchmarks.synthetic import QUICK_QUESTIONS, quick_engine
    from rag_demo.retrieval.corpus import Passage

    engine = quick_engine(tmp_path, torch.device("cpu"))
    retrieval = engine.retrieve(QUICK_QUESTIONS[0], k=2)
    texts = [engine.generator.format_input(retrieval.generator_question, Passage(p.title, p.text)) for p in retrieval.passages]
    answer = speed.plain_rag_token(engine.generator, texts, retrieval.doc_lp, max_new_tokens=5)
    assert 1 <= len(answer) <= 5
    assert all(t not in engine.generator.stop_ids for t in answer[:-1])
    assert answer == list(engine.ask(QUICK_QUESTIONS[0], k=2, variants=("token",), max_new_tokens=5,
                                     closed_book=False).variants["token"].token_ids)


def test_table_formats_numbers():
    from benchmarks.speed import table

    text = table([{"a": 0.000123, "b": 12345.6, "c": float("nan")}], ["a", "b", "c"])
    assert text.splitlines()[-1] == "| 0.000123 | 12,346 | - |"


def test_gpu_bench_imports_and_searches_without_faiss():
    """The GPU machine has the repository tree, torch and transformers only: nothing `python -m benchmarks.gpu`
    imports may need faiss or datasets."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = (
        "import sys; sys.modules['faiss'] = None; sys.modules['datasets'] = None\n"
        "import benchmarks.gpu\n"
        "import numpy as np\n"
        "from rag_demo.config import IndexConfig\n"
        "from rag_demo.retrieval.index import build_index, has_faiss\n"
        "assert not has_faiss()\n"
        "xb = np.random.default_rng(0).standard_normal((50, 8)).astype('float32')\n"
        "scores, ids = build_index('flat', xb, IndexConfig()).search(xb[:3], 2)\n"
        "products = xb[:3] @ xb.T\n"  # the exact answer, computed apart: (3, 50)
        "expected = np.argsort(-products, axis=1, kind='stable')[:, :2]\n"
        "assert ids.tolist() == expected.tolist(), (ids, expected)\n"
        "assert np.allclose(scores, np.take_along_axis(products, expected, axis=1), atol=1e-5), scores\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_gpu_bench_tiny_runs_on_cpu(tmp_path):
    from benchmarks import gpu

    out = tmp_path / "gpu.json"
    assert gpu.main(["--tiny", "--device", "cpu", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["mismatches"] == [] and report["vs_transformers"][0]["identical"] == "2/2"
    assert [(row["batch"], row["variant"].split()[0]) for row in report["search"]] == [(1, "fp16"), (1, "engine"), (32, "fp16"),
                                                                                       (32, "engine")]
    assert report["question"][0]["new_tokens"] == gpu.TINY.new_tokens


def test_chunked_exact_search_equals_one_matmul():
    from rag_demo.retrieval.flat import search_tensor

    generator = torch.Generator().manual_seed(0)
    xb, xq = torch.randn(1000, 16, generator=generator), torch.randn(4, 16, generator=generator)
    whole = (xq @ xb.T).topk(7, dim=1)
    for chunk in (1, 64, 999, 5000):
        scores, ids = search_tensor(xq, xb, 7, chunk_rows=chunk)
        assert torch.equal(ids, whole.indices) and torch.allclose(scores, whole.values)


def test_synthetic_queries_have_near_neighbours():
    """Queries share the base vectors' topics, so exact top-10 neighbours stand out from random rows
    and recall against flat measures an index, not noise."""
    import numpy as np

    from benchmarks.synthetic import synthetic_vectors

    xb = synthetic_vectors(4000, 96, 32, seed=0)
    xq = synthetic_vectors(50, 96, 32, seed=1)
    assert xb.shape == (4000, 96) and xb.dtype == np.float32
    assert np.allclose(np.linalg.norm(xb, axis=1), 1.0, atol=1e-5)
    sims = xq @ xb.T  # (50, 4000)
    tenth = np.sort(sims, axis=1)[:, -10]
    assert np.median(tenth) > 0.7 and np.median(sims) < 0.2
    assert not np.allclose(synthetic_vectors(10, 96, 32, seed=2), synthetic_vectors(10, 96, 32, seed=3))


def test_posterior_sharpness_replays_rag_sequence_exactly(tiny_engine, monkeypatch):
    """At m = 1 the replayed marginal picks the engine's own answer; m = 0 averages the passages."""
    from benchmarks import posterior_sharpness as sharpness
    from rag_demo import engine as engine_module

    recorder = sharpness._Recorder(engine_module.rag_sequence_logprob)
    monkeypatch.setattr(engine_module, "rag_sequence_logprob", recorder)
    kb = next(iter(tiny_engine.kbs))
    for question in ("who wrote a farewell to arms", "what is the capital of france"):
        answers, per_doc, doc_lp, engine_answer = sharpness.candidate_table(tiny_engine, question, kb=kb, k=3, recorder=recorder)
        assert per_doc.shape == (len(answers), 3) and doc_lp.shape == (3,)
        assert sharpness.best_answer(answers, per_doc, doc_lp, 1.0) == engine_answer
        flat = torch.logsumexp(per_doc, dim=-1).argmax()  # p(z|x) uniform
        assert sharpness.best_answer(answers, per_doc, doc_lp, 0.0) == answers[int(flat)]


def test_memory_choice_threshold_picks_the_better_source_per_question():
    import numpy as np

    from benchmarks.memory_choice import best_threshold

    signal = np.array([0.1, 0.9, 0.5, 0.7])
    closed = np.array([False, True, False, True])
    rag = np.array([True, False, True, False])
    assert best_threshold(signal, closed, rag) == (1.0, 0.7)  # closed-book from 0.7 up: all four right
    assert best_threshold(signal, closed & False, rag)[1] == float("inf")  # memory never helps: no threshold


def test_everyday_reading_target_is_the_passage_s_own_spelling():
    from benchmarks.everyday_reading import passage_form

    assert passage_form("Its capital is OTTAWA, on the river.", "Ottawa") == "OTTAWA"
    assert passage_form("Ottawans live here.", "Ottawa") == "Ottawa"  # not a whole word: the answer as given


def test_lead_questions_ask_for_the_subject_of_each_lead_sentence():
    from benchmarks.lead_questions import lead_questions

    articles = {"h": {"title": "Henry VIII", "topic": "People", "description": "King of England from 1509 to 1547",
                      "extract": "Henry VIII was King of England from 1509 until his death. He is best known for his six "
                                 "marriages. In 1536 the monasteries were dissolved."},
                "x": {"title": "Not in the base", "topic": "", "description": "", "extract": "It is elsewhere."}}
    texts = ["Henry VIII was King of England from 1509 until his death.", "He is best known for his six marriages. "
             "In 1536 the monasteries were dissolved."]
    pairs = lead_questions(articles, ["Henry VIII", "Henry VIII"], texts)
    assert pairs == [("who was King of England from 1509 until his death?", 0),
                     ("who is best known for his six marriages?", 1),  # the row that holds the sentence
                     ("who is king of England from 1509 to 1547?", 0)]  # the monasteries' subject is not Henry


def test_candidate_ceiling_counts_a_right_candidate_the_answer_passed_over():
    from benchmarks.candidate_ceiling import tally_question
    from rag_demo.results import AskResult, ClosedBookResult, RetrievedPassage, VariantResult

    def variant(name: str, answer: str, candidates=()) -> VariantResult:
        return VariantResult(name, answer, (answer,), (1,), -1.0, (-1.0,), ((-1.0,),), ((1.0,),), (-1.0,),
                             candidates=candidates)

    passage = RetrievedPassage(1, 0, "Moons", "Ganymede is the largest moon.", 0.5, 1.0, 10.0)
    result = AskResult("what is the largest moon?", "kb", "flat", 1, (passage,),
                       {"token": variant("token", "Titan"), "sequence": variant("sequence", "Titan", (("Titan", -1.0), ("Ganymede", -2.0)))},
                       ClosedBookResult("Io", ("Io",), (-1.0,), -1.0), {})
    right = tally_question(result, ["Ganymede"])
    assert right == {"token": False, "sequence": False, "closed": False, "candidate": True, "either": True, "passages": True}
    assert not tally_question(result, ["Callisto"])["candidate"]


def test_sureness_bench_counts_right_answers_in_each_band_of_p(tmp_path, capsys):
    import math

    from benchmarks import sureness as bench
    from rag_demo.config import LIKELY_RIGHT_P, LIKELY_WRONG_P

    probabilities = [0.9, 0.3, LIKELY_RIGHT_P, 0.1, 0.06, LIKELY_WRONG_P, 0.01, 0.001, 0.5]
    right = [True, True, False, True, False, True, False, False, True]
    predictions = ["Paris"] * 8 + ["the capital is the city of Paris"]  # the last a sentence: no band on the page
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"kb": "wikipedia", "variant": "token", "k": 5, "exact_match": hit,
                                           "prediction": said, "logprob": math.log(p)}) + "\n"
                               for p, hit, said in zip(probabilities, right, predictions)), encoding="utf-8")
    rows = {row["band"]: row for row in bench.band_rows("a", bench.read_records(answers))}
    # 0.9, 0.3 and the threshold itself are likely right; from LIKELY_WRONG_P up to it unsure; under it likely wrong
    assert [(rows[band]["answers"], rows[band]["right"]) for band in ("likely right", "unsure", "likely wrong")] == [
        (3, 2), (3, 2), (2, 0)]
    assert [(row["answers"], row["right"]) for band, row in rows.items() if band.startswith("a sentence")] == [(1, 1)]
    bench.main([str(answers)])
    assert "| answers.jsonl | wikipedia | token | 5 | likely right | 3 | 2 | 66.7 (" in capsys.readouterr().out
    older = tmp_path / "older.jsonl"  # written before answers carried their log p(y|x)
    older.write_text(json.dumps({"kb": "wikipedia", "variant": "token", "k": 5, "exact_match": True}) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="no answer with its log p"):
        bench.read_records(older)
