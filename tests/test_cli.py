"""`python -m rag_demo` end to end on a saved tiny RAG checkpoint and KB folder."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rag_demo.config import ASK

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def saved(tiny_parts, tiny_kb, rag_config, tmp_path_factory):
    from transformers import RagTokenForGeneration, RagTokenizer

    from rag_demo.retrieval.corpus import save_kb

    folder = tmp_path_factory.mktemp("cli")
    model = RagTokenForGeneration(config=rag_config, question_encoder=tiny_parts["q_enc"], generator=tiny_parts["bart"])
    model.save_pretrained(folder / "rag")
    RagTokenizer(question_encoder=tiny_parts["q_tok"], generator=tiny_parts["gen_tok"]).save_pretrained(folder / "rag")
    save_kb(tiny_kb, folder / "kb")
    return folder


def run(*args, cache=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    if cache:
        env["RAG_DEMO_CACHE"] = str(cache)
    return subprocess.run([sys.executable, "-m", "rag_demo", *args], capture_output=True, text=True, env=env, timeout=300)


def test_ask_json_end_to_end(saved, tiny_engine):
    out = run("ask", "who wrote a farewell to arms", "--rag-checkpoint", str(saved / "rag"),
              "--kb-path", f"tiny={saved / 'kb'}", "--k", "3", "--max-new-tokens", "6", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) >= {"question", "passages", "variants", "closed_book", "timings_ms"}
    assert [set(p) >= {"rank", "id", "title", "text", "score", "prob"} for p in data["passages"]] == [True] * 3
    assert set(data["variants"]) == {"token", "sequence"}
    for variant in data["variants"].values():
        assert set(variant) >= {"answer", "tokens", "logprob", "posteriors"}
        assert all(abs(sum(row) - 1) < 1e-5 for row in variant["posteriors"])
    assert set(data["closed_book"]) >= {"answer", "token_logprobs"}
    assert set(data["timings_ms"]) >= {"encode", "search", "generate", "total"}
    # the loaded checkpoint answers exactly as the in-memory engine over the same modules
    expected = tiny_engine.ask("who wrote a farewell to arms", k=3, max_new_tokens=6)
    assert data["variants"]["token"]["token_ids"] == list(expected.variants["token"].token_ids)
    assert data["variants"]["sequence"]["logprob"] == pytest.approx(expected.variants["sequence"].logprob, abs=1e-4)


def test_score_and_readable_summary(saved):
    out = run("score", "capital of france", "paris", "--rag-checkpoint", str(saved / "rag"),
              "--kb-path", f"tiny={saved / 'kb'}", "--k", "2", "--index", "hnsw")
    assert out.returncode == 0, out.stderr
    assert "RAG-Token" in out.stdout and "RAG-Sequence" in out.stdout and "p(z|x)=" in out.stdout
    assert "hnsw index, dense" in out.stdout and "bm25=" not in out.stdout


def test_hybrid_retrieval_from_the_command_line(saved):
    out = run("ask", "capital of france", "--rag-checkpoint", str(saved / "rag"), "--kb-path", f"tiny={saved / 'kb'}",
              "--k", "2", "--lexical-weight", "2.5", "--max-new-tokens", "2", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["retriever"], data["lexical_weight"]) == ("hybrid", 2.5)
    for p in data["passages"]:
        assert p["logit"] == pytest.approx(data["scale"] * p["score"] + 2.5 * p["lexical"], abs=1e-4)


def test_bm25_retrieval_from_the_command_line(saved):
    from rag_demo.config import BM25_SCALE

    out = run("ask", "who wrote a farewell to arms", "--rag-checkpoint", str(saved / "rag"), "--kb-path",
              f"tiny={saved / 'kb'}", "--k", "3", "--retriever", "bm25", "--max-new-tokens", "2", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["retriever"], data["scale"], data["lexical_weight"]) == ("bm25", BM25_SCALE, 0.0)
    assert data["passages"][0]["title"] == "Hemingway"
    for p in data["passages"]:
        assert p["score"] == p["lexical"] and p["logit"] == pytest.approx(BM25_SCALE * p["score"], abs=1e-5)
    out = run("score", "capital of france", "paris", "--rag-checkpoint", str(saved / "rag"), "--kb-path",
              f"tiny={saved / 'kb'}", "--k", "2", "--retriever", "bm25", "--index", "hnsw")
    assert out.returncode == 0, out.stderr
    assert f"BM25 over every passage, p(z|x) = softmax({BM25_SCALE:g}·bm25)" in out.stdout
    assert "the hnsw index holds dense vectors, so it was not used" in out.stdout
    assert "bm25=" in out.stdout and "score=" not in out.stdout


def test_memory_from_the_command_line(saved, tiny_engine):
    """--memory-logit makes the generator's memory a source of a RAG checkpoint: the JSON carries p(∅|x) and
    memory's posteriors, as the same engine in memory gives them; the text prints memory's line and column."""
    import copy

    from rag_demo.config import MemoryConfig

    question = "who wrote a farewell to arms"
    theta = tiny_engine.retrieve(question, k=3).passages[0].logit
    model = ("--rag-checkpoint", str(saved / "rag"), "--kb-path", f"tiny={saved / 'kb'}", "--k", "3")
    out = run("ask", question, *model, "--max-new-tokens", "6", "--memory-logit", str(theta), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["memory_logit"] == pytest.approx(theta) and 0 < data["memory_prob"] < 1
    assert sum(p["prob"] for p in data["passages"]) + data["memory_prob"] == pytest.approx(1, abs=1e-5)
    remembering = copy.copy(tiny_engine)
    remembering.config = replace(tiny_engine.config, memory=MemoryConfig(logit=theta))
    expected = remembering.ask(question, k=3, max_new_tokens=6)
    for name, variant in data["variants"].items():
        assert variant["token_ids"] == list(expected.variants[name].token_ids)
        assert variant["memory_posteriors"] == pytest.approx(expected.variants[name].memory_posteriors, abs=1e-4)
        for row, memory in zip(variant["posteriors"], variant["memory_posteriors"]):
            assert sum(row) + memory == pytest.approx(1, abs=1e-4)

    out = run("ask", question, *model, "--max-new-tokens", "3", "--memory-logit", str(theta))
    assert out.returncode == 0, out.stderr
    assert f"∅. p(∅|x)={data['memory_prob']:.3f} logit={theta:.2f}" in out.stdout
    token_lines = [line for line in out.stdout.splitlines() if "closed-book p=" in line]
    assert token_lines and all("  memory=" in line for line in token_lines)
    out = run("score", question, "hemingway", *model, "--no-memory")
    assert out.returncode == 0, out.stderr
    assert "memory is no source" in out.stdout and "memory=" not in out.stdout
    out = run("compare", question, *model, "--memory-logit", str(theta))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("∅. p(∅|x)=") == 2  # under dense and under BM25
    text = out.stdout
    # the JSON carries the same share, as a softmax of the k logits and θ gives it (a review found it only in the text)
    out = run("compare", question, *model, "--memory-logit", str(theta), "--json")
    assert out.returncode == 0, out.stderr
    for ranking in json.loads(out.stdout)["rankings"]:
        logits = [p["logit"] for p in ranking["passages"]]
        share = math.exp(theta) / (math.exp(theta) + sum(math.exp(x) for x in logits))
        assert ranking["memory_logit"] == pytest.approx(theta) and ranking["memory_prob"] == pytest.approx(share, rel=1e-6)
        assert f"∅. p(∅|x)={share:.3f} logit={theta:.2f}" in text
    off = json.loads(run("compare", question, *model, "--no-memory", "--json").stdout)["rankings"]
    assert all(r["memory_logit"] is None and r["memory_prob"] is None for r in off)


def test_memory_options_reach_the_engine_config():
    from rag_demo.cli import build_parser, engine_config

    parse = build_parser().parse_args
    assert parse(["ask", "q"]).memory is None and engine_config(parse(["ask", "q"])).memory.logit is None
    assert parse(["score", "q", "a", "--memory"]).memory is True and parse(["compare", "q", "--no-memory"]).memory is False
    assert engine_config(parse(["ask", "q", "--memory-logit", "-2.5"])).memory.logit == -2.5


def test_compare_end_to_end(saved, tmp_path):
    import shutil

    from rag_demo.config import BM25_SCALE
    from rag_demo.questions import QUESTIONS_FILE

    kb = shutil.copytree(saved / "kb", tmp_path / "kb")  # stored with its questions, as the default KBs are
    row = {"question": "Who wrote A Farewell to Arms?", "answer": "Hemingway", "swapped_answer": "x",
           "passage_answer": "Hemingway", "gold_id": 0}
    (kb / QUESTIONS_FILE).write_text(json.dumps(row) + "\n")
    base = ("compare", "who wrote a farewell to arms", "--rag-checkpoint", str(saved / "rag"), "--kb-path", f"tiny={kb}",
            "--k", "3")
    out = run(*base, "--lexical-weight", "0.5", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["question"], data["kb"], data["k"], data["gold_ids"]) == ("who wrote a farewell to arms", "tiny", 3, [0])
    assert [r["retriever"] for r in data["rankings"]] == ["dense", "bm25", "hybrid"]
    by_name = {r["retriever"]: r for r in data["rankings"]}
    assert (by_name["bm25"]["scale"], by_name["hybrid"]["lexical_weight"]) == (BM25_SCALE, 0.5)
    assert by_name["bm25"]["passages"][0]["id"] == 0 and by_name["bm25"]["gold_rank"] == 1
    for ranking in data["rankings"]:
        assert len(ranking["passages"]) == 3 and sum(p["prob"] for p in ranking["passages"]) == pytest.approx(1, abs=1e-5)
        ranks = [p["rank"] for p in ranking["passages"] if p["id"] == 0]
        assert ranking["gold_rank"] == (ranks[0] if ranks else None)
    out = run(*base)
    assert out.returncode == 0, out.stderr
    assert "gold passage: row 0" in out.stdout and "[gold] Hemingway" in out.stdout
    assert f"BM25: p(z|x) = softmax({BM25_SCALE:g}·bm25); gold at rank 1" in out.stdout and "dense + BM25" not in out.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["ask", "  "], "question is empty"),
        (["ask", "?"], "has no words: ask it in words"),
        (["score", "who wrote hamlet?", "?!"], "the answer '?!' has no words: give the answer in words"),
        (["ask", "q", "--k", "0"], "argument --k: must be between 1 and 20"),
        (["ask", "q", "--index", "lsh"], "invalid choice"),
        (["ask", "q", "--variant", "beam"], "invalid choice"),
        (["ask", "q", "--k", "15"], "larger than the knowledge base"),
        (["ask", "q", "--kb", "nope"], "unknown knowledge base"),
        (["ask", "q", "--kb", "/no/such/kb"], "no knowledge base folder at '/no/such/kb': the path does not exist"),
        (["eval", "--questions", "/no/such.jsonl", "--n", "1"], "the file does not exist"),
        (["ask", "q", "--scale", "-1"], "argument --scale: must be above 0"),
        (["ask", "q", "--scale", "inf"], "argument --scale: must be above 0"),
        (["ask", "q", "--kb-path", "x=/does/not/exist"], "does not exist"),
        (["ask", "q", "--generator", "/no/such/model"], "does not exist"),
        (["ask", "q", "--retriever", "hybrid"], "needs a lexical weight"),
        (["ask", "q", "--lexical-weight", "-1"], "--lexical-weight must be 0 or more"),
        (["ask", "q", "--extractive"], "causal generators only"),
        (["ask", "q", "--retriever", "sparse"], "invalid choice"),
        (["compare", "q", "--retriever", "bm25"], "unrecognized arguments"),  # compare runs every retriever
        (["ask", "q", "--memory"], "no fitted logit for the generator's memory"),  # required, and none is fitted
        (["compare", "q", "--memory"], "no fitted logit for the generator's memory"),
        (["score", "q", "a", "--memroy"], "unrecognized arguments: --memroy"),
        (["ask", "q", "--memory", "--no-memory"], "not allowed with argument"),
        (["ask", "q", "--no-memory", "--memory-logit", "1"], "give one of them"),
        (["ask", "q", "--memory-logit", "high"], "invalid float value"),
        (["ask", "q", "--memory-logit", "nan"], "--memory-logit must be a finite number"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(saved, args, message, tmp_path):
    base = ["--rag-checkpoint", str(saved / "rag"), "--kb-path", f"tiny={saved / 'kb'}"]
    if "--kb-path" in args:
        base = ["--rag-checkpoint", str(saved / "rag")]
    if "--generator" in args:
        base = ["--kb-path", f"tiny={saved / 'kb'}"]
    out = run(*args, *base, cache=tmp_path)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_an_unknown_default_kb_name_is_refused_before_any_model_loads(monkeypatch, capsys):
    import rag_demo.cli as cli

    monkeypatch.setattr(cli, "make_engine", lambda args: pytest.fail("a model was loaded for an unknown base"))
    for command in (["ask", "who wrote hamlet?"], ["score", "who wrote hamlet?", "Shakespeare"], ["eval", "--n", "1"]):
        assert cli.main([*command, "--kb", "wikipedai"]) == 2
        said = capsys.readouterr().err
        assert "unknown knowledge base 'wikipedai'; choose one of wikipedia, wikipedia-counterfactual" in said


@pytest.mark.parametrize("vectors", ["arrow", "float16"])
def test_build_kb_from_files(tmp_path, vectors):
    import numpy as np

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("word " * 150)
    (src / "b.md").write_text("the quick brown fox")
    out = run("build-kb", str(src), str(tmp_path / "kb"), "--vectors", vectors)
    assert out.returncode == 0, out.stderr
    from rag_demo.retrieval.corpus import load_kb

    kb = load_kb(tmp_path / "kb")
    assert len(kb) == 3 and kb.dim == 384 and kb.normalized
    assert isinstance(kb.embeddings, np.memmap) == (vectors == "float16")


def test_default_k_is_lowered_to_a_smaller_knowledge_base_and_a_given_k_is_kept():
    from types import SimpleNamespace

    from rag_demo.cli import _k, build_parser

    engine = SimpleNamespace(resolve_kb=lambda kb: ["only passage"] if kb == "one" else ["p"] * 50)
    assert _k(build_parser().parse_args(["ask", "q", "--kb", "one"]), engine) == 1
    assert _k(build_parser().parse_args(["ask", "q"]), engine) == ASK.k
    assert _k(build_parser().parse_args(["score", "q", "a", "--kb", "one", "--k", "3"]), engine) == 3  # the engine refuses it


def test_eval_table_end_to_end_and_bad_ks(saved):
    from rag_demo.cli import main

    assert main(["eval", "--table", "--ks", "5,0"]) == 2
    out = run("eval", "--table", "--ks", "1,2", "--n", "2", "--rag-checkpoint", str(saved / "rag"),
              "--kb-path", f"tiny={saved / 'kb'}", "--max-new-tokens", "4")
    # the tiny KB has no questions.jsonl: a one-line message, not a table or a traceback
    assert out.returncode == 2 and "no evaluation questions" in out.stderr and "Traceback" not in out.stderr


def test_numbers_over_the_limits_are_refused_before_loading_a_model(capsys):
    from rag_demo.cli import build_parser, main
    from rag_demo.config import LIMITS

    over = [("--k", LIMITS.max_k), ("--num-beams", LIMITS.max_beams), ("--max-new-tokens", LIMITS.max_new_tokens)]
    for flag, most in over:
        assert getattr(build_parser().parse_args(["ask", "q", flag, str(most)]), flag[2:].replace("-", "_")) == most
        assert main(["ask", "q", flag, str(most + 1)]) == 2
        assert f"argument {flag}: must be between 1 and {most}" in capsys.readouterr().err
    assert main(["eval", "--table", "--ks", f"5,{LIMITS.max_k + 1}"]) == 2
    assert f"every k must be between 1 and {LIMITS.max_k}" in capsys.readouterr().err
    assert main(["ask", "x" * (LIMITS.max_input_chars + 1)]) == 2
    assert f"the limit is {LIMITS.max_input_chars:,}" in capsys.readouterr().err


def test_dtype_and_kb_sample_options_reach_the_engine_config():
    from rag_demo.cli import build_parser, engine_config

    args = build_parser().parse_args(["eval", "--dtype", "bfloat16", "--kb-sample", "1500", "--generator", "some/model"])
    config = engine_config(args)
    assert (config.generator.dtype, config.generator.model, args.kb_sample) == ("bfloat16", "some/model", 1500)
    assert engine_config(build_parser().parse_args(["ask", "q"])).generator.dtype == "float32"
    from rag_demo.cli import main

    assert main(["eval", "--dtype", "float64"]) == 2  # not a choice: one line, exit 2


def test_untuned_questions_option_keeps_the_packaged_question_encoder():
    from rag_demo.cli import build_parser, engine_config

    assert engine_config(build_parser().parse_args(["ask", "q"])).encoder.tuned
    config = engine_config(build_parser().parse_args(["eval", "--untuned-questions", "--scale", "30"]))
    assert (config.encoder.tuned, config.encoder.scale) == (False, 30.0)


def test_keep_restatements_option_reaches_the_engine_config():
    from rag_demo.cli import build_parser, engine_config

    assert engine_config(build_parser().parse_args(["ask", "q"])).decoding.set_aside_restatements
    for argv in (["ask", "q", "--keep-restatements", "--num-beams", "2"], ["eval", "--keep-restatements"]):
        assert not engine_config(build_parser().parse_args(argv)).decoding.set_aside_restatements


def test_untuned_generator_option_keeps_the_converted_generator():
    from rag_demo.cli import build_parser, engine_config

    assert engine_config(build_parser().parse_args(["ask", "q"])).generator.tuned
    config = engine_config(build_parser().parse_args(["eval", "--untuned-generator", "--dtype", "bfloat16"]))
    assert (config.generator.tuned, config.generator.dtype, config.encoder.tuned) == (False, "bfloat16", True)


@pytest.mark.parametrize("how", ["--kb", "--kb-path"])
def test_transformers_custom_kb_from_the_command_line(saved, tiny_parts, rag_config, how, tmp_path):
    """A folder + faiss file as transformers' use_own_knowledge_dataset.py leaves them, given by path."""
    import torch
    from transformers import RagConfig, RagRetriever

    from tests import tiny

    passages_path, index_path = tiny.transformers_custom_kb(tmp_path, tiny_parts["q_tok"], tiny_parts["ctx_enc"])
    config = RagConfig.from_question_encoder_generator_configs(
        rag_config.question_encoder, rag_config.generator, n_docs=3, index_name="custom",
        passages_path=str(passages_path), index_path=str(index_path))
    retriever = RagRetriever(config, tiny_parts["q_tok"], tiny_parts["gen_tok"])
    question = "who wrote a farewell to arms"
    q_ids = tiny_parts["q_tok"]([question], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hidden = tiny_parts["q_enc"](q_ids).pooler_output.numpy()
    expected = retriever(q_ids, hidden, n_docs=3, return_tensors="pt")["doc_ids"][0].tolist()
    kb = ["--kb", str(passages_path)] if how == "--kb" else ["--kb-path", f"custom={passages_path}"]
    out = run("ask", question, "--rag-checkpoint", str(saved / "rag"), *kb, "--k", "3", "--index", "hnsw",
              "--variant", "token", "--max-new-tokens", "2", "--no-closed-book", "--json", cache=tmp_path / "cache")
    assert out.returncode == 0, out.stderr
    assert [p["id"] for p in json.loads(out.stdout)["passages"]] == expected


def test_a_checkpoint_over_a_kb_folder_builds_nothing_of_the_offline_default(saved, tmp_path):
    """`--rag-checkpoint DIR --kb KB_DIR` reads that folder only: an empty cache stays empty."""
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    for command in (("score", "capital of france", "paris"), ("ask", "capital of france", "--max-new-tokens", "4")):
        out = run(*command, "--rag-checkpoint", str(saved / "rag"), "--kb", str(saved / "kb"), "--k", "2", "--json",
                  cache=cache)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["passages"]
    assert list(cache.iterdir()) == []


def test_build_bm25_saves_a_kb_folders_index(tmp_path, capsys, monkeypatch):
    import numpy as np

    from rag_demo.cli import main
    from rag_demo.retrieval.corpus import Passage, load_kb, make_kb, save_kb
    from rag_demo.retrieval.lexical import LexicalIndex, lexical_path

    passages = [Passage("Mozart", "magic flute vienna"), Passage("Baikal", "deep lake siberia")]
    folder = save_kb(make_kb("x", passages, np.eye(2, 4)), tmp_path / "kb")  # arrow KBs are saved without BM25
    assert main(["build-bm25", str(folder), "--max-postings", "4"]) == 2  # 8 postings
    assert "bm25 and hybrid retrieval are off" in capsys.readouterr().err and not lexical_path(folder).exists()
    assert main(["build-bm25", str(folder)]) == 0
    assert f"BM25 of 2 passages (8 terms, 8 postings) is in {lexical_path(folder)}" in capsys.readouterr().out
    kb = load_kb(folder)
    monkeypatch.setattr("rag_demo.retrieval.lexical._build", None)  # what retrieval opens is the saved index, not a rebuild
    index = LexicalIndex.for_kb_folder(folder, kb.titles, kb.texts, fingerprint=kb.fingerprint)
    assert index.top("siberia", 2).tolist() == [1] and index.size == 2


def test_build_index_saves_a_kb_folders_index_where_asks_look(tmp_path, capsys):
    import numpy as np

    from rag_demo.cli import main
    from rag_demo.config import EngineConfig
    from rag_demo.retrieval.corpus import Passage, load_kb, make_kb, save_kb
    from rag_demo.retrieval.index import index_cache_paths

    vectors = np.random.default_rng(0).standard_normal((400, 8)).astype(np.float32)
    passages = [Passage(f"title {i}", f"text {i}") for i in range(400)]
    folder = save_kb(make_kb("x", passages, vectors), tmp_path / "kb", vectors="float16")  # read from disk, streamed
    assert main(["build-index", str(folder), "--kind", "ivfpq"]) == 0
    out = capsys.readouterr()
    kb = load_kb(folder)
    path, _ = index_cache_paths("ivfpq", kb.fingerprint, folder / "indexes", EngineConfig().index)
    assert f"ivfpq index of 400 passages ({path.stat().st_size:,} bytes) is in {path}" in out.out
    assert "building the ivfpq index: [" in out.err and "400/400" in out.err
    assert main(["build-index", str(folder), "--kind", "ivfpq"]) == 0
    assert "was already in" in capsys.readouterr().out
    assert main(["build-index", str(folder), "--kind", "flat"]) == 2  # exact search needs no index


def test_eval_writes_every_answer_and_two_runs_compare_question_by_question(saved, tmp_path, capsys):
    import shutil

    from benchmarks import paired_answers
    from rag_demo.cli import main
    from rag_demo.questions import QUESTIONS_FILE

    assert main(["eval", "--answers", str(tmp_path / "missing" / "answers.jsonl")]) == 2  # before any model loads
    assert "cannot write --answers" in capsys.readouterr().err
    kb = tmp_path / "kb"
    shutil.copytree(saved / "kb", kb)
    rows = 6  # the tiny KB's passages; three questions each make one held-out group of about 18 / 5
    with (kb / QUESTIONS_FILE).open("w", encoding="utf-8") as handle:
        for row in range(rows):
            for word in ("first", "second", "third"):
                handle.write(json.dumps({"question": f"{word} question about passage {row}", "answer": f"{word} answer {row}",
                                         "swapped_answer": "", "passage_answer": "zzz", "gold_id": row}) + "\n")
    answers = tmp_path / "answers.jsonl"
    out = run("eval", "--n", "3", "--k", "2", "--answers", str(answers), "--rag-checkpoint", str(saved / "rag"),
              "--kb-path", f"tiny={kb}", "--max-new-tokens", "4", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    records = [json.loads(line) for line in answers.read_text(encoding="utf-8").splitlines()]
    assert len(records) == report["n"] == 3
    assert all((r["kb"], r["variant"], r["k"]) == ("tiny", "token", 2) and r["answer"] == "zzz" for r in records)
    assert sum(r["exact_match"] for r in records) / 3 == report["exact_match"]
    flipped = tmp_path / "flipped.jsonl"  # the same answers with the first question scored the other way
    records[0]["exact_match"] = not records[0]["exact_match"]
    flipped.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert paired_answers.main([str(answers), str(flipped)]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[:4] == ["tiny", "token", "2", "3"]
    assert cells[7:] == (["0", "1"] if records[0]["exact_match"] else ["1", "0"]) + ["1.000"]
    assert cells[6].startswith("+33.3" if records[0]["exact_match"] else "-33.3")


def test_paired_answers_refuses_a_file_that_is_not_eval_answers(tmp_path):
    import doctest

    from benchmarks import paired_answers

    assert doctest.testmod(paired_answers).failed == 0  # McNemar's p for 2 against 8: 0.1094, as scipy's binomtest gives

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q"}\n', encoding="utf-8")
    with pytest.raises(SystemExit, match="line 1: not a record"):
        paired_answers.main([str(bad), str(bad)])
    with pytest.raises(SystemExit, match="cannot read"):
        paired_answers.main([str(tmp_path / "none.jsonl"), str(bad)])
