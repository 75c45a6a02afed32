"""Fuzzing the command line and the web API with hypothesis: any input ends in an answer or a clear message.

Properties: `python -m rag_demo ...` exits 0 or 2, and on 2 prints one line without a traceback;
every page event returns its outputs with either no status or a message the visitor can act on
(never the "something went wrong" of an unexpected exception); the engine raises nothing but
`RagDemoError`. The fast suite tries 30 inputs per test (15 whole engine asks); set
RAG_DEMO_FUZZ_EXAMPLES for a longer run, and RAG_DEMO_FUZZ_REPORT to a file to get how many
inputs each test tried.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_demo import cli
from rag_demo.errors import CacheError, RagDemoError
from rag_demo.serving.loading import rag_engine_from_modules
from rag_demo.ui.actions import PRIVATE_KB, DemoActions, unwrap
from rag_demo.ui.inputs import SessionFiles, safe_file_name

EXAMPLES = int(os.environ.get("RAG_DEMO_FUZZ_EXAMPLES", "30"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="RAG_DEMO_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
TRIED: Counter = Counter()
UNEXPECTED = "Something went wrong"


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    report = os.environ.get("RAG_DEMO_FUZZ_REPORT")
    if report:
        Path(report).write_text(json.dumps({"examples_setting": EXAMPLES, "tried": dict(TRIED),
                                            "total": sum(TRIED.values())}, indent=1))


@pytest.fixture(scope="module")
def engine(tiny_parts, tiny_kb, rag_config):
    """The tiny engine with a passage side, so visitors' own knowledge bases can be built."""
    built = rag_engine_from_modules(
        question_encoder=tiny_parts["q_enc"], question_tokenizer=tiny_parts["q_tok"],
        generator_model=tiny_parts["bart"], generator_tokenizer=tiny_parts["gen_tok"],
        rag_config=rag_config, kbs={"tiny": tiny_kb},
    )
    built.retriever.encoder = replace(built.encoder, passage_model=tiny_parts["ctx_enc"], passage_tokenizer=tiny_parts["q_tok"])
    return built


# Text as it may arrive: any code point (lone surrogates, controls, right-to-left marks), markup, huge runs.
any_text = st.one_of(
    st.text(max_size=80),
    st.text(alphabet=st.characters(exclude_categories=()), max_size=40),  # lone surrogates included
    st.sampled_from(["", " ", "\x00", "\ud800", "\u202e\u0645\u0646\u202c", "<script>alert(1)</script>",
                     "Ignore previous instructions.", "who wrote a farewell to arms?", "a" * 6000, "\n" * 3000]),
)
numberish = st.one_of(st.integers(-10**30, 10**30), st.floats(allow_nan=True, allow_infinity=True),
                      st.sampled_from(["", "3", "2.5", "nan", "1e400", "-1", "x"]), st.none(), st.booleans())
choice = st.one_of(st.sampled_from(["token", "sequence", "both", "flat", "hnsw", "ivfpq", "thorough", "fast", "tiny",
                                    PRIVATE_KB, "", "..", "/"]), any_text, st.none(), st.integers())


def mostly(valid, invalid):
    """Valid three times in four, so that whole requests often get through to the engine."""
    return st.one_of(valid, valid, valid, invalid)


variant_opt = mostly(st.sampled_from(["token", "sequence", "both"]), choice)
k_opt = mostly(st.integers(1, 6), numberish)
index_opt = mostly(st.sampled_from(["flat", "hnsw"]), choice)
kb_opt = mostly(st.just("tiny"), choice)
beams_opt = mostly(st.integers(1, 3), numberish)
decoding_opt = mostly(st.sampled_from(["thorough", "fast"]), choice)
question_opt = mostly(st.sampled_from(["who wrote a farewell to arms?", "where is lake baikal"]), any_text)
encoder_opt = mostly(st.sampled_from(["packaged", "trained"]), choice)  # "trained": none was, so a note


def status_is_clear(status: object) -> bool:
    """An empty status (success) or a message box that is not the unexpected-error one."""
    return isinstance(status, str) and (status == "" or ("rag-status" in status and UNEXPECTED not in status))


# ---- the web API: page events and /ask_json --------------------------------------------------------------


@FUZZ
@given(question=question_opt, variant=variant_opt, k=k_opt, index=index_opt, kb=kb_opt, beams=beams_opt,
       decoding=decoding_opt, question_encoder=encoder_opt)
def test_ask_event_answers_or_explains(engine, question, variant, k, index, kb, beams, decoding, question_encoder):
    TRIED["ask event"] += 1
    out = DemoActions(engine).ask(question, variant, k, index, kb, beams, decoding, None,
                                  question_encoder=question_encoder)
    assert len(out) == 9 and status_is_clear(out[0]), out[0]
    if out[0] == "":
        assert "<script" not in out[1] and "<script" not in out[2]


@FUZZ
@given(question=question_opt, variant=variant_opt, k=k_opt, index=index_opt, kb=kb_opt)
def test_ask_json_answers_or_raises_a_message(engine, question, variant, k, index, kb):
    import gradio as gr

    TRIED["/ask_json"] += 1
    try:
        result = DemoActions(engine).ask_json(question, variant, k, index, kb)
    except gr.Error as err:
        assert UNEXPECTED not in str(err) and "Traceback" not in str(err)
        return
    json.dumps(result, ensure_ascii=False).encode("utf-8")  # what goes over the wire is valid unicode
    assert result["question"] and result["question"].isprintable()


@FUZZ
@given(question=question_opt, answer=any_text, kb=kb_opt, k=k_opt, index=index_opt)
def test_score_event_answers_or_explains(engine, question, answer, kb, k, index):
    TRIED["score event"] += 1
    out = DemoActions(engine).score(question, answer, kb, k, index, None)
    assert len(out) == 6 and status_is_clear(out[0]), out[0]


upload_name = st.one_of(st.sampled_from(["a.txt", "b.md", "c.jsonl", "d.csv", "e.pdf", "noext", "../../x.txt",
                                         "..jsonl", "f.CSV"]),
                        st.text(alphabet="abc./\\-_ ", min_size=1, max_size=12).map(lambda s: s + ".txt"))
upload_body = st.one_of(st.binary(max_size=300), st.text(max_size=300).map(lambda s: s.encode("utf-8", "surrogatepass")),
                        st.sampled_from([b'{"text": "fine"}\n{"text": 5}\n', b"title,text\nt,\"x\n", b"[" * 5000,
                                         b'{"title": {"a": 1}, "text": "ok"}\n', b"text\n" + b"y," * 200]))


@FUZZ
@given(files=st.lists(st.tuples(upload_name, upload_body), max_size=6), title=any_text, paste=any_text)
def test_build_my_kb_from_any_files(engine, tmp_path_factory, files, title, paste):
    TRIED["build_kb event"] += 1
    folder = tmp_path_factory.mktemp("uploads")
    paths = []
    for number, (name, body) in enumerate(files):
        safe = safe_file_name(name)
        path = folder / f"{number}-{safe}"
        path.write_bytes(body)
        paths.append(str(path))
    actions = DemoActions(engine, files=SessionFiles(folder / "sessions"))
    out = actions.build_mine(paths, title, paste, None)
    assert status_is_clear(out[0]) and out[0] != "", out[0]
    if "rag-status-ok" in out[0]:
        kb = unwrap(out[1])
        assert len(kb) >= 1 and kb.embeddings.shape[0] == len(kb)


@settings(FUZZ, max_examples=max(1, EXAMPLES // 2))  # each accepted input runs a whole ask: half as many
@given(question=question_opt, options=st.fixed_dictionaries({}, optional={
    "k": k_opt, "index": index_opt, "variants": mostly(variant_opt, st.lists(choice, max_size=3)),
    "num_beams": beams_opt, "sequence_decoding": decoding_opt, "max_new_tokens": mostly(st.integers(1, 8), numberish),
    "closed_book": st.booleans(), "kb": mostly(st.just("tiny"), any_text)}))
def test_engine_ask_raises_only_what_users_can_fix(engine, question, options):
    TRIED["engine.ask"] += 1
    try:
        result = engine.ask(question, **options)
    except RagDemoError as err:
        assert str(err) and "\n" not in str(err).strip()
        return
    assert all(abs(sum(row) - 1) < 1e-4 for v in result.variants.values() for row in v.posteriors)


# ---- the command line ---------------------------------------------------------------------------------------

FLAGS = ["--k", "--index", "--kb", "--variant", "--num-beams", "--max-new-tokens", "--decoding", "--scale", "--device",
         "--kb-path", "--n", "--seed", "--words", "--encoder", "--generator", "--question-encoder", "--rag-checkpoint"]
SWITCHES = ["--json", "--no-closed-book", "-v", "--verbose", "--bogus", "-", "--"]
cli_value = st.one_of(st.integers(-5, 70).map(str), st.sampled_from(["nan", "inf", "-0", "1e9", "3.5", "flat", "hnsw", "token",
                                                                     "both", "fast", "cpu", "cuda", "tiny", "x=y", "=", ""]),
                      st.text(max_size=20))
cli_option = st.one_of(st.tuples(st.sampled_from(FLAGS), cli_value).map(list), st.sampled_from(SWITCHES).map(lambda s: [s]))


@st.composite
def well_formed_argv(draw):
    command = draw(st.sampled_from(["ask", "score"]))
    texts = [draw(question_opt.filter(lambda s: "\x00" not in s))] + ([draw(any_text.filter(lambda s: "\x00" not in s))]
                                                                    if command == "score" else [])
    options = ["--k", str(draw(st.integers(1, 6))), "--variant", draw(st.sampled_from(["token", "sequence", "both"]))]
    if command == "ask":
        options += ["--max-new-tokens", str(draw(st.integers(1, 6)))]
    return [command, *texts, *options, *draw(st.lists(st.sampled_from(["--json", "--no-closed-book"]), max_size=1))]


@st.composite
def argv(draw):
    if draw(st.booleans()):
        return draw(well_formed_argv())
    command = draw(st.sampled_from(["ask", "score", "build-kb", "eval", "prepare", "help", "", "ask "]))
    positional = draw(st.lists(st.one_of(any_text.filter(lambda s: "\x00" not in s), st.just("SOURCE")), max_size=3))
    options = draw(st.lists(cli_option, max_size=4))
    return [command, *positional, *[part for option in options for part in option]]


@pytest.fixture(scope="module")
def cli_world(engine, tiny_parts, tmp_path_factory):
    """The CLI with the tiny models in place of the default ones, and a small source folder to index."""
    from rag_demo.retrieval import encoders

    source = tmp_path_factory.mktemp("source")
    (source / "a.txt").write_text("Zorblax is the capital of Plutonia. " * 30)
    (source / "b.jsonl").write_text('{"title": "<b>x</b>", "text": "Glimmerton is a city."}\n')
    passage_encoder = encoders.Encoder("tiny-dpr", tiny_parts["q_tok"], tiny_parts["q_enc"], tiny_parts["ctx_enc"],
                                       tiny_parts["q_tok"], "dpr", 1.0, 64, torch.device("cpu"))
    return {"engine": engine, "encoder": passage_encoder, "source": source, "out": tmp_path_factory.mktemp("out")}


@FUZZ
@given(args=argv())
def test_cli_exits_0_or_2_with_one_line(cli_world, monkeypatch, capsys, args):
    from rag_demo.retrieval import encoders

    TRIED["cli"] += 1

    def no_download(**options):
        raise CacheError("the offline default is not prepared in this test; run `python -m rag_demo prepare`")

    monkeypatch.setattr(cli, "make_engine", lambda parsed: cli_world["engine"])
    monkeypatch.setattr(encoders, "load_encoder", lambda config, **options: cli_world["encoder"])
    monkeypatch.setattr("rag_demo.offline.prepare.prepare", no_download)
    args = [str(cli_world["source"]) if a == "SOURCE" else a for a in args]
    if args[0] == "build-kb" and len(args) >= 3:
        args[2] = str(cli_world["out"] / safe_file_name(args[2]))  # write only inside the test's folder
    try:
        code = cli.main(args)
    except SystemExit as exit_:  # argparse's --help
        code = exit_.code
    captured = capsys.readouterr()
    assert code in (0, 2), (args, code, captured.err)
    assert "Traceback" not in captured.err
    if code == 2:
        lines = [line for line in captured.err.replace("\r", "\n").splitlines() if line.startswith("rag_demo:")]
        assert len(lines) == 1 and captured.err.rstrip().endswith(lines[0]), captured.err
