from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a download attempt fails loudly instead of hanging

import pytest
import torch

from tests import tiny


@pytest.fixture(autouse=True)
def _offline_and_private_cache(request, monkeypatch, tmp_path_factory):
    """Fast tests get a throw-away cache; slow tests share the real one (built once, minutes)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if request.node.get_closest_marker("slow") is None:
        monkeypatch.setenv("RAG_DEMO_CACHE", str(tmp_path_factory.getbasetemp() / "rag-demo-cache"))


@pytest.fixture(scope="session")
def tiny_parts(tmp_path_factory):
    """Tokenizers, a DPR question/context encoder pair and a BART generator, all tiny and random."""
    folder = tmp_path_factory.mktemp("tiny")
    gen_tok = tiny.bart_tokenizer(folder / "bart")
    q_tok = tiny.dpr_tokenizer(folder / "dpr")
    q_enc, ctx_enc = tiny.tiny_dpr(q_tok.vocab_size)
    bart = tiny.tiny_bart(len(gen_tok))
    return {"gen_tok": gen_tok, "q_tok": q_tok, "q_enc": q_enc, "ctx_enc": ctx_enc, "bart": bart, "folder": folder}


@pytest.fixture(scope="session")
def tiny_kb(tiny_parts):
    from rag_demo.retrieval.corpus import Passage, make_kb

    passages = [Passage(t, x) for t, x in tiny.PASSAGES]
    tok = tiny_parts["q_tok"]
    with torch.no_grad():
        batch = tok([p.title for p in passages], [p.text for p in passages], padding=True, return_tensors="pt")
        vectors = tiny_parts["ctx_enc"](**batch).pooler_output
    return make_kb("tiny", passages, vectors.numpy(), encoder="tiny-dpr")


@pytest.fixture(scope="session")
def rag_config(tiny_parts):
    from transformers import RagConfig

    return RagConfig.from_question_encoder_generator_configs(
        tiny_parts["q_enc"].config, tiny_parts["bart"].config, n_docs=3, max_combined_length=64,
    )


@pytest.fixture(scope="session")
def tiny_engine(tiny_parts, tiny_kb, rag_config):
    """A RAG engine over the tiny BART and DPR that mirrors transformers' RAG classes."""
    from rag_demo.serving.loading import rag_engine_from_modules

    return rag_engine_from_modules(
        question_encoder=tiny_parts["q_enc"], question_tokenizer=tiny_parts["q_tok"],
        generator_model=tiny_parts["bart"], generator_tokenizer=tiny_parts["gen_tok"],
        rag_config=rag_config, kbs={"tiny": tiny_kb},
    )


@pytest.fixture(scope="module")
def causal_engine(tiny_parts, tiny_kb):
    """A RAG engine over the tiny DPR with a tiny random Llama as its generator: the causal-LM path."""
    from rag_demo.config import EngineConfig, GeneratorConfig
    from rag_demo.engine import RagEngine
    from rag_demo.generation.generator import CausalGenerator
    from rag_demo.retrieval.encoders import encoder_from_modules

    tokenizer = tiny_parts["gen_tok"]
    model = tiny.tiny_causal(len(tokenizer))
    generator = CausalGenerator(model, tokenizer, GeneratorConfig(model="tiny-llama", max_prompt_tokens=400), name="tiny-llama")
    encoder = encoder_from_modules("tiny-dpr", tiny_parts["q_enc"], tiny_parts["q_tok"])
    return RagEngine(encoder=encoder, generator=generator, kbs={"tiny": tiny_kb}, config=EngineConfig())


@pytest.fixture
def reader(tiny_parts, one_torch_thread):
    """(a tiny causal generator, one reading example per passage)."""
    from rag_demo.config import GeneratorConfig
    from rag_demo.generation.generator import CausalGenerator
    from rag_demo.retrieval.corpus import Passage
    from rag_demo.training.reader import ReadingExample

    tokenizer = tiny_parts["gen_tok"]
    generator = CausalGenerator(tiny.tiny_causal(len(tokenizer)), tokenizer,
                                GeneratorConfig(model="tiny-llama", max_prompt_tokens=400), name="tiny-llama")
    examples = []
    for row, question, answer in tiny.PASSAGE_QUESTIONS:
        prompt = generator.format_input(question, Passage(*tiny.PASSAGES[row]))
        examples.append(ReadingExample(tuple(tokenizer(prompt)["input_ids"]), generator.answer_target(answer).ids))
    return generator, examples


@pytest.fixture(scope="session")
def ui_engine(tmp_path_factory):
    """A real engine on tiny random models with two knowledge bases and a passage encoder, for the UI tests."""
    from tests.ui_engine import make_ui_engine

    return make_ui_engine(tmp_path_factory.mktemp("ui-engine"))


@pytest.fixture(scope="module")
def browser():
    """A Chromium driven by playwright, for the browser tests; skipped where either is missing."""
    from tests.browser_pages import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing; install it with `apt-get update && apt-get install -y chromium`")
    sync_api = pytest.importorskip("playwright.sync_api")
    sync_api.expect.set_options(timeout=TIMEOUT_MS)
    playwright = sync_api.sync_playwright().start()
    chromium = None
    try:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
    finally:
        if chromium is not None:
            chromium.close()
        playwright.stop()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run much faster on one thread (no thread wake-ups per small op); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def offline_source(tmp_path, monkeypatch):
    """(cache, task.json bytes): a cache whose bigbench sdist and leads wheel were 'downloaded by hand';
    pip would fail if called."""
    import hashlib
    from dataclasses import replace

    from rag_demo.offline import leads, registry, source
    from tests.offline_fakes import failing_pip, leads_json, make_sdist, make_wheel, task_json

    cache = tmp_path / "cache"
    payload, lead_payload = task_json(), leads_json()
    make_sdist(source.manual_sdist_path(cache), payload)
    make_wheel(registry.manual_download_path(leads.LEADS_SOURCE, cache), lead_payload)
    monkeypatch.setattr(source, "TASK_SOURCE", replace(source.TASK_SOURCE, sha256=hashlib.sha256(payload).hexdigest()))
    monkeypatch.setattr(leads, "LEADS_SOURCE", replace(leads.LEADS_SOURCE, sha256=hashlib.sha256(lead_payload).hexdigest()))
    monkeypatch.setattr(registry, "_pip_download_command", failing_pip)
    return cache, payload


@pytest.fixture
def default_setup(offline_source, tmp_path, monkeypatch, one_torch_thread):
    """(cache, encoder config): a tiny BERT and a tiny Llama stand in for the default models."""
    from rag_demo.config import EncoderConfig
    from rag_demo.offline.cache import write_marker
    from rag_demo.offline.gguf import generator_key

    cache, _ = offline_source
    folder = str(tiny.tiny_sentence_encoder(tmp_path / "encoder"))
    monkeypatch.setattr("rag_demo.offline.tuned.DEFAULT_ENCODER", folder)
    monkeypatch.setattr("rag_demo.offline.prepare.resolve_encoder_path", lambda model: model)
    name, key = generator_key()
    write_marker(tiny.tiny_causal_folder(cache / "models" / name), key)
    return cache, EncoderConfig(model=folder, max_length=32)


@pytest.fixture(scope="module")
def vectors():
    """(3000, 32) unit vectors around 20 centres: clustered like embeddings, so approximate indexes have recall to lose."""
    import numpy as np

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(20, 32))
    xb = centers[rng.integers(0, 20, 3000)] + 0.3 * rng.normal(size=(3000, 32))
    return (xb / np.linalg.norm(xb, axis=1, keepdims=True)).astype(np.float32)
