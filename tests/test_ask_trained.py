"""Asking and scoring with a question encoder trained on the page: for one call, for one visitor, never the
engine's own; on the Ask, Score and Swap tabs alike.

The oracle for p(z|x) is written out here: the question's vector straight from the model (DPR's pooled output),
dotted with the knowledge base's stored passage vectors, a softmax over the top k. Nothing of `Encoder` or the
retriever computes it.
"""

from __future__ import annotations

import copy
import re
from dataclasses import replace

import numpy as np
import pytest
import torch

from rag_demo.errors import InputError
from rag_demo.serving.interface import NoTrainedEncoder
from rag_demo.serving.retriever_training import PageRunConfig, TrainingRuns

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRAIN = [("What is the capital of France?", ("Paris",)), ("Who wrote A Farewell to Arms?", ("Ernest Hemingway", "Hemingway")),
         ("How tall is the Eiffel Tower?", ("330 metres",)), ("Who created the Python programming language?",
                                                              ("Guido van Rossum",))]
HELD_OUT = [("What is the largest planet in the Solar System?", ("Jupiter",)), ("Who won the 2018 FIFA World Cup?", ("France",))]
QUESTION = "Who won the 2018 FIFA World Cup?"
KB = "nq-wiki"


def as_retrieved(question: str) -> str:
    """The question as the retriever reads it: without the marks that end it (`encoders.retrieval_question`)."""
    return question.rstrip(" ?!.")


def oracle_probs(model: torch.nn.Module, engine, question: str, rows, kb: str = KB) -> np.ndarray:
    """p(z|x) over `rows`: softmax of scale · q(x)ᵀd(z), q(x) the model's pooled output for the question."""
    with torch.no_grad():
        batch = engine.encoder.tokenizer([as_retrieved(question)], return_tensors="pt")
        vector = model.eval()(**batch).pooler_output[0].double().numpy()  # (D,)
    logits = engine.encoder.scale * engine.kbs[kb].embeddings[list(rows)].astype(np.float64) @ vector  # (K,)
    return np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()


def oracle_top(model: torch.nn.Module, engine, question: str, k: int, kb: str = KB) -> list[int]:
    """The exact top k rows under the model's question vector."""
    with torch.no_grad():
        vector = model.eval()(**engine.encoder.tokenizer([as_retrieved(question)], return_tensors="pt")).pooler_output[0].numpy()
    return [int(r) for r in np.argsort(-(engine.kbs[kb].embeddings @ vector), kind="stable")[:k]]


def moved(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """A copy of the model whose weights moved far (a long training run, for what it does to p(z|x))."""
    copied = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in copied.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    return copied.eval()


def _probs(result) -> np.ndarray:
    return np.array([p.prob for p in result.passages])


def _rows(result) -> list[int]:
    return [p.id for p in result.passages]


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("index", ["flat", "hnsw", "ivfpq"])
def test_an_ask_weighs_passages_by_the_given_models_question_vector(ui_engine, index):
    own = ui_engine.encoder.question_model
    before = _weights(own)
    other = moved(own)
    given = ui_engine.ask(QUESTION, kb=KB, k=3, index=index, retriever="dense", variants="token", memory=False,
                          question_model=other)
    default = ui_engine.ask(QUESTION, kb=KB, k=3, index=index, retriever="dense", variants="token", memory=False)
    np.testing.assert_allclose(_probs(given), oracle_probs(other, ui_engine, QUESTION, _rows(given)), atol=1e-5)
    np.testing.assert_allclose(_probs(default), oracle_probs(own, ui_engine, QUESTION, _rows(default)), atol=1e-5)
    if index == "flat":  # exact search: the given vector's own top k
        assert _rows(given) == oracle_top(other, ui_engine, QUESTION, 3)
        assert _rows(default) == oracle_top(own, ui_engine, QUESTION, 3)
    assert _rows(given) != _rows(default) or not np.allclose(_probs(given), _probs(default), atol=1e-3)
    assert given.question_encoder == "a question side given for this call" and default.question_encoder == "tiny-dpr"
    assert ui_engine.encoder.question_model is own  # the engine's own encoder, untouched
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(own)))


def test_a_score_weighs_passages_by_the_given_models_question_vector(ui_engine):
    other = moved(ui_engine.encoder.question_model, seed=1)
    scored = ui_engine.score(QUESTION, "France", kb=KB, k=3, retriever="dense", memory=False, question_model=other)
    np.testing.assert_allclose(_probs(scored), oracle_probs(other, ui_engine, QUESTION, _rows(scored)), atol=1e-5)
    assert _rows(scored) == oracle_top(other, ui_engine, QUESTION, 3)


def test_bm25_reads_no_vector_and_names_no_encoder(ui_engine):
    other = moved(ui_engine.encoder.question_model)
    given = ui_engine.ask(QUESTION, kb=KB, k=3, retriever="bm25", variants="token", question_model=other)
    default = ui_engine.ask(QUESTION, kb=KB, k=3, retriever="bm25", variants="token")
    assert _rows(given) == _rows(default) and np.allclose(_probs(given), _probs(default))
    assert given.question_encoder == default.question_encoder == ""


def test_a_configured_memory_logit_serves_a_given_model_and_a_fitted_one_does_not(ui_engine):
    """θ fitted for the packaged question side (the default setup's) is no logit for another question side."""
    from rag_demo.config import DEFAULT_ENCODER, DEFAULT_GENERATOR, DEFAULT_MEMORY_LOGITS
    from rag_demo.engine import RagEngine
    from rag_demo.generation.generator import CausalGenerator
    from tests.ui_engine import with_memory

    other = moved(ui_engine.encoder.question_model)
    configured = with_memory(ui_engine, 2.0).ask(QUESTION, kb=KB, k=3, retriever="dense", variants="token",
                                                  question_model=other)
    assert configured.memory_logit == 2.0 and configured.memory_prob is not None
    gen = ui_engine.generator
    default_setup = RagEngine(encoder=replace(ui_engine.encoder, name=DEFAULT_ENCODER),
                              generator=CausalGenerator(gen.model, gen.tokenizer, gen.config, name=DEFAULT_GENERATOR),
                              kbs=ui_engine.kbs, config=ui_engine.config)
    own = default_setup.ask(QUESTION, kb=KB, k=3, retriever="dense", variants="token")
    assert own.memory_logit == DEFAULT_MEMORY_LOGITS["dense"]
    given = default_setup.ask(QUESTION, kb=KB, k=3, retriever="dense", variants="token", question_model=other)
    assert given.memory_logit is None and given.memory_prob is None
    with pytest.raises(InputError, match="no fitted logit for the generator's memory with a question encoder of its own"):
        default_setup.ask(QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=True, question_model=other)


# ---- a visitor's run on the page (`TrainingRuns`) ---------------------------------------------------------------


@pytest.fixture()
def runs(ui_engine):
    config = PageRunConfig(steps=4, check_every=2, held_out_sample=2, top_k=3)
    return TrainingRuns(lambda: ui_engine, config=config, question_sets={KB: (TRAIN, HELD_OUT)})


def _trained_model(runs: TrainingRuns, session: str) -> torch.nn.Module:
    return runs._runs[session].trainer.model


def test_asking_with_the_trained_encoder_uses_that_runs_question_vector(runs, ui_engine):
    runs.train_begin("a", objective="rag-token", questions=4)
    runs.train_advance("a", steps=4)
    trained = runs.train_ask("a", QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=False)
    default = ui_engine.ask(QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=False)
    np.testing.assert_allclose(_probs(trained), oracle_probs(_trained_model(runs, "a"), ui_engine, QUESTION, _rows(trained)),
                               atol=1e-5)
    assert _rows(trained) == oracle_top(_trained_model(runs, "a"), ui_engine, QUESTION, 3)
    assert trained.question_encoder == "trained on this page (RAG-Token, 4 steps)"
    assert default.question_encoder == "tiny-dpr"
    # four steps at the page's learning rate move p(z|x) by about 1e-2 here: far above float noise
    assert np.abs(_probs(trained) - _probs(default)).max() > 1e-3
    scored = runs.train_score("a", QUESTION, "France", kb=KB, k=3, retriever="dense", memory=False)
    np.testing.assert_allclose(_probs(scored), _probs(trained), atol=1e-6)
    assert scored.question_encoder == trained.question_encoder


def test_another_visitor_and_the_engine_keep_their_own_encoder(runs, ui_engine):
    own = ui_engine.encoder.question_model
    before = _weights(own)
    default_before = ui_engine.ask(QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=False)
    runs.train_begin("a", objective="rag-token", questions=4)
    runs.train_advance("a", steps=4)
    runs.train_begin("b", objective="rag-sequence", questions=4)
    runs.train_advance("b", steps=2)
    a = runs.train_ask("a", QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=False)
    b = runs.train_ask("b", QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=False)
    assert (a.question_encoder, b.question_encoder) == ("trained on this page (RAG-Token, 4 steps)",
                                                        "trained on this page (RAG-Sequence, 2 steps)")
    np.testing.assert_allclose(_probs(b), oracle_probs(_trained_model(runs, "b"), ui_engine, QUESTION, _rows(b)), atol=1e-5)
    assert not np.allclose(_probs(a), _probs(b), atol=1e-4)
    with pytest.raises(NoTrainedEncoder, match="holds no trained question encoder"):
        runs.train_ask("c", QUESTION, kb=KB, k=3)
    default_after = ui_engine.ask(QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=False)
    assert _rows(default_after) == _rows(default_before) and np.allclose(_probs(default_after), _probs(default_before))
    assert ui_engine.encoder.question_model is own and all(torch.equal(x, y) for x, y in zip(before, _weights(own)))


def test_an_ended_run_leaves_no_encoder_to_ask_with_and_a_new_run_starts_from_the_packaged_one(runs, ui_engine):
    runs.train_begin("a", objective="rag-token", questions=4)
    runs.train_advance("a", steps=4)
    runs.train_end("a")
    with pytest.raises(NoTrainedEncoder):
        runs.train_ask("a", QUESTION, kb=KB, k=3)
    with pytest.raises(InputError, match="train one on the Train tab"):  # a NoTrainedEncoder is the page's InputError
        runs.train_score("a", QUESTION, "France", kb=KB, k=3)
    runs.train_begin("a", objective="gold-passage", questions=4)
    fresh = runs.train_ask("a", QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=False)
    default = ui_engine.ask(QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=False)
    assert fresh.question_encoder == "trained on this page (gold passage, 0 steps)"
    assert _rows(fresh) == _rows(default) and np.allclose(_probs(fresh), _probs(default), atol=1e-6)


def test_an_ask_between_steps_sees_the_encoder_in_eval_mode_and_training_goes_on(runs, ui_engine):
    """An ask puts the trained copy in eval mode (no dropout); the next step trains it again."""
    runs.train_begin("a", objective="rag-token", questions=4)
    runs.train_advance("a", steps=1)
    model = _trained_model(runs, "a")
    model.train()  # as a step leaves it: dropout on (the tiny DPR's is 0.1)
    first = runs.train_ask("a", QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=False)
    model.train()
    again = runs.train_ask("a", QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=False)
    assert np.array_equal(_probs(first), _probs(again))
    np.testing.assert_allclose(_probs(first), oracle_probs(model, ui_engine, QUESTION, _rows(first)), atol=1e-5)
    view = runs.train_advance("a", steps=3)
    assert view.step == 4 and view.question_encoder == "trained on this page (RAG-Token, 4 steps)"


def test_the_trained_encoder_is_asked_with_through_the_background_engine(ui_engine, monkeypatch):
    from rag_demo.serving.background import BackgroundEngine

    monkeypatch.setattr("rag_demo.serving.retriever_training.QUESTION_SETS_FOR_KB", {KB: (TRAIN, HELD_OUT)})
    engine = BackgroundEngine(lambda progress: ui_engine).start()
    assert engine.wait(10)
    engine.train_begin("a", objective="rag-token", questions=4, kb=KB)
    engine.train_advance("a", steps=3)
    trained = engine.train_ask("a", QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=False)
    assert trained.question_encoder == "trained on this page (RAG-Token, 3 steps)"
    default = engine.ask(QUESTION, kb=KB, k=3, retriever="dense", variants="token", memory=False)
    assert default.question_encoder == "tiny-dpr"
    with pytest.raises(InputError, match="unexpected keyword argument 'kk'"):
        engine.train_ask("a", QUESTION, kk=3)
    with pytest.raises(NoTrainedEncoder):
        engine.train_score("b", QUESTION, "France")


# ---- the page: the Ask tab offers this visitor's trained encoder, and only theirs -------------------------------


def _request(session: str):
    from types import SimpleNamespace

    return SimpleNamespace(session_hash=session)


def _no_progress(*args, **kwargs):
    return None


def _page_ask(actions, session: str, question_encoder: str, *, retriever: str = "dense"):
    return actions.ask(QUESTION, "token", 3, "flat", KB, 1, "thorough", None, retriever, False, False, question_encoder,
                       request=_request(session), progress=_no_progress)


def test_a_run_offers_its_encoder_on_the_ask_tab_once_it_has_taken_a_step(runs):
    from rag_demo.ui.train import REPLACED_NOTE, TrainActions

    actions = TrainActions(runs, steps_per_update=2, progress_poll_s=60.0)  # no reading counts among them
    updates = list(actions.train("rag-token", 4, _request("a")))
    offers = [u.ask_encoder for u in updates]
    for update in updates:  # the Score and Swap tabs are offered the same, each its own copy (gradio pops a value)
        assert update.score_encoder == update.swap_encoder == update.ask_encoder
        assert update.score_encoder is not update.ask_encoder and update.swap_encoder is not update.ask_encoder
    assert offers[0] == {"__type__": "update"}  # reading: nothing trained yet, the choice stays hidden
    assert offers[1] == {"__type__": "update"}  # step 0: the packaged encoder's copy, nothing to offer
    assert offers[2]["choices"] == [("packaged", "packaged"), ("trained on this page (RAG-Token, 2 steps)", "trained")]
    assert offers[-1]["choices"][1] == ("trained on this page (RAG-Token, 4 steps)", "trained")
    assert offers[-1]["visible"] and "value" not in offers[-1]  # the visitor's choice stays theirs
    assert "Ask with it on the Ask tab" in updates[-1].status
    again = actions.train("rag-sequence", 4, _request("a"), earlier="a")
    reading = next(again)
    assert reading.ask_encoder["value"] == "packaged" and reading.ask_encoder["choices"] == [("packaged", "packaged")]
    assert reading.ask_encoder["info"] == REPLACED_NOTE
    assert reading.score_encoder == reading.swap_encoder == reading.ask_encoder  # every tab goes back to packaged
    assert list(again)[-1].ask_encoder["choices"][1] == ("trained on this page (RAG-Sequence, 4 steps)", "trained")


def test_the_ask_tab_asks_with_the_visitors_trained_encoder_and_says_so(runs, ui_engine):
    from rag_demo.ui.actions import DemoActions
    from rag_demo.ui.views import unwrap

    runs.train_begin("a", objective="rag-token", questions=4)
    runs.train_advance("a", steps=4)
    actions = DemoActions(ui_engine, runs=runs)
    trained, packaged = _page_ask(actions, "a", "trained"), _page_ask(actions, "a", "packaged")
    result = unwrap(trained.last)
    assert trained.status == "" and "question encoder: trained on this page (RAG-Token, 4 steps)" in trained.answer
    assert result.to_json()["question_encoder"] == "trained on this page (RAG-Token, 4 steps)"  # the JSON download's
    np.testing.assert_allclose(_probs(result), oracle_probs(_trained_model(runs, "a"), ui_engine, QUESTION, _rows(result)),
                               atol=1e-5)
    assert list(trained.doc_prob["value"].data[0].x) == pytest.approx(list(_probs(result)))
    assert "question encoder: tiny-dpr" in packaged.answer and unwrap(packaged.last).question_encoder == "tiny-dpr"
    bm25 = _page_ask(actions, "a", "trained", retriever="bm25")
    assert "question encoder:" not in bm25.answer  # BM25 computes no q(x)
    # the memory switch left on: why no ∅ shows, in words that fit the encoder asked with
    from rag_demo.ui.html import MEMORY_UNAVAILABLE, MEMORY_UNAVAILABLE_TRAINED, esc

    on = actions.ask(QUESTION, "token", 3, "flat", KB, 1, "thorough", None, "dense", False, True, "trained",
                     request=_request("a"), progress=_no_progress)
    assert esc(MEMORY_UNAVAILABLE_TRAINED) in on.answer and esc(MEMORY_UNAVAILABLE) not in on.answer


def test_another_visitor_has_no_trained_encoder_and_the_choice_goes_back_to_packaged(runs, ui_engine):
    from rag_demo.ui.actions import DemoActions
    from rag_demo.ui.train import GONE_NOTE

    runs.train_begin("a", objective="rag-token", questions=4)
    runs.train_advance("a", steps=4)
    actions = DemoActions(ui_engine, runs=runs)
    for session in ("b", ""):  # another visitor's page; a call without a session (an API client)
        refused = _page_ask(actions, session, "trained")
        assert "trained question encoder is gone" in refused.status and "Traceback" not in refused.status
        assert refused.question_encoder["value"] == "packaged" and refused.question_encoder["info"] == GONE_NOTE
        assert refused.answer == refused.last == {"__type__": "update"}  # the last answer stays as it was
    runs.train_end("a")  # the visitor's state expired while the page stayed open
    assert "trained question encoder is gone" in _page_ask(actions, "a", "trained").status
    unknown = _page_ask(actions, "a", "mine")
    assert "unknown question encoder" in unknown.status


def test_the_page_has_a_question_encoder_choice_hidden_until_a_run_offers_one(ui_engine):
    """Every visitor's page starts with each tab's choice hidden: only their own run's updates show it."""
    from rag_demo.ui import build_demo

    demo = build_demo(ui_engine)
    by_id = {getattr(block, "elem_id", None): block for block in demo.blocks.values()}
    for elem_id in ("question-encoder", "score-question-encoder", "swap-question-encoder"):
        radio = by_id[elem_id]
        assert radio.value == "packaged" and not radio.visible and radio.choices == [("packaged", "packaged")]
    train_fn = next(fn for fn in demo.fns.values() if getattr(fn.fn, "__name__", "") == "train")
    assert {getattr(block, "elem_id", None) for block in train_fn.outputs} >= {
        "question-encoder", "score-question-encoder", "swap-question-encoder"}


# ---- the Score and Swap tabs: the same choice ---------------------------------------------------------------------


def _page_score(actions, session: str, question_encoder: str, *, memory: bool = False):
    return actions.score(QUESTION, "France", KB, 3, "flat", None, memory, question_encoder, request=_request(session),
                         progress=_no_progress)


def _page_swap(actions, session: str, question_encoder: str):
    return actions.swap(QUESTION, KB, "nq-counterfactual", "token", 3, None, False, question_encoder,
                        request=_request(session), progress=_no_progress)


def _shown_priors(markup: str) -> tuple[list[int], np.ndarray]:
    """The rows and p(z|x) the Score tab's line of priors shows, in its order."""
    found = re.findall(r'<span class="rag-prior" data-row="(\d+)">.*?<b>([0-9.]+)</b></span>', markup)
    return [int(row) for row, _ in found], np.array([float(prob) for _, prob in found])


def test_the_score_tab_scores_with_the_visitors_trained_encoder_and_says_so(runs, ui_engine):
    from rag_demo.ui.actions import DemoActions
    from rag_demo.ui.html import MEMORY_UNAVAILABLE, MEMORY_UNAVAILABLE_TRAINED, esc

    runs.train_begin("a", objective="rag-token", questions=4)
    runs.train_advance("a", steps=4)
    actions = DemoActions(ui_engine, runs=runs)
    trained, packaged = _page_score(actions, "a", "trained"), _page_score(actions, "a", "packaged")
    assert trained.status == "" and trained.question_encoder == {"__type__": "update"}
    assert "question encoder: trained on this page (RAG-Token, 4 steps)" in trained.cards
    assert "question encoder: tiny-dpr" in packaged.cards and "trained on this page" not in packaged.cards
    # the p(z|x) shown: softmax over the top k of the trained encoder's q(x) · the passages' vectors, by hand
    model = _trained_model(runs, "a")
    rows, shown = _shown_priors(trained.cards)
    assert rows == oracle_top(model, ui_engine, QUESTION, 3)
    np.testing.assert_allclose(shown, oracle_probs(model, ui_engine, QUESTION, rows), atol=6e-4)  # shown to 3 decimals
    packaged_rows, packaged_shown = _shown_priors(packaged.cards)
    own = ui_engine.encoder.question_model
    np.testing.assert_allclose(packaged_shown, oracle_probs(own, ui_engine, QUESTION, packaged_rows), atol=6e-4)
    # far enough apart that the test tells the two encoders apart at 3 decimals
    assert rows != packaged_rows or np.abs(shown - packaged_shown).max() > 3e-3
    # p(y|x) follows p(z|x): the score is the trained encoder's, the same as the engine's call with it
    direct = runs.train_score("a", QUESTION, "France", kb=KB, k=3, memory=False)
    assert direct.question_encoder == "trained on this page (RAG-Token, 4 steps)"
    assert direct.to_json()["question_encoder"] == direct.question_encoder  # the score's JSON names it too
    from rag_demo.ui.html import fmt_log

    assert all(f"log {fmt_log(v.logprob)}" in trained.cards for v in direct.variants.values())
    # the memory switch left on: memory is no source with a trained encoder, and the result says why
    on = _page_score(actions, "a", "trained", memory=True)
    assert esc(MEMORY_UNAVAILABLE_TRAINED) in on.cards and esc(MEMORY_UNAVAILABLE) not in on.cards
    assert "∅ memory" not in on.cards


def test_a_configured_memory_logit_makes_memory_a_source_of_a_trained_score(ui_engine):
    from rag_demo.ui.actions import DemoActions
    from tests.ui_engine import with_memory

    engine = with_memory(ui_engine, 2.0)
    runs = TrainingRuns(lambda: engine, config=PageRunConfig(steps=2, check_every=2, held_out_sample=2, top_k=3),
                        question_sets={KB: (TRAIN, HELD_OUT)})
    runs.train_begin("a", objective="rag-token", questions=4)
    runs.train_advance("a", steps=1)
    out = _page_score(DemoActions(engine, runs=runs), "a", "trained", memory=True)
    assert out.status == "" and "question encoder: trained on this page (RAG-Token, 1 step)" in out.cards
    assert "∅ memory" in out.cards and "no fitted logit" not in out.cards


def test_the_score_tab_falls_back_to_packaged_when_the_trained_encoder_is_gone(runs, ui_engine):
    from rag_demo.ui.actions import DemoActions
    from rag_demo.ui.train import GONE_NOTE

    runs.train_begin("a", objective="rag-token", questions=4)
    runs.train_advance("a", steps=2)
    actions = DemoActions(ui_engine, runs=runs)
    for session in ("b", ""):  # another visitor never scores with a's encoder; nor does a call without a session
        refused = _page_score(actions, session, "trained")
        assert "trained question encoder is gone" in refused.status and "Traceback" not in refused.status
        assert refused.question_encoder["value"] == "packaged" and refused.question_encoder["info"] == GONE_NOTE
        assert refused.question_encoder["choices"] == [("packaged", "packaged")]
        assert refused.cards == refused.heat_token == {"__type__": "update"}  # the last score stays as it was
    runs.train_end("a")
    assert "trained question encoder is gone" in _page_score(actions, "a", "trained").status
    assert "unknown question encoder" in _page_score(actions, "a", "mine").status


def test_the_swap_tab_asks_both_sides_with_the_trained_encoder(runs, ui_engine):
    from rag_demo.ui.actions import DemoActions
    from rag_demo.ui.train import GONE_NOTE

    runs.train_begin("a", objective="rag-token", questions=4)
    runs.train_advance("a", steps=4)
    actions = DemoActions(ui_engine, runs=runs)
    out = _page_swap(actions, "a", "trained")
    assert out.status == "" and out.question_encoder == {"__type__": "update"}
    model = _trained_model(runs, "a")
    for column, kb in ((out.left, KB), (out.right, "nq-counterfactual")):
        assert column.count("question encoder: trained on this page (RAG-Token, 4 steps)") == 1
        shown = np.array([float(p) for p in re.findall(r"p\(z\|x\) <b>([0-9.]+)</b>", column)])
        expected = oracle_probs(model, ui_engine, QUESTION, oracle_top(model, ui_engine, QUESTION, 3, kb), kb)
        np.testing.assert_allclose(shown, expected, atol=6e-4)
    assert "different question encoders" not in out.summary
    packaged = _page_swap(actions, "a", "packaged")
    assert "question encoder: tiny-dpr" in packaged.left and "trained on this page" not in packaged.left + packaged.right
    refused = _page_swap(actions, "b", "trained")
    assert "trained question encoder is gone" in refused.status and refused.question_encoder["info"] == GONE_NOTE
    assert refused.left == refused.summary == {"__type__": "update"}


def test_a_swap_whose_sides_had_different_encoders_says_so(runs, ui_engine):
    """A run that steps between the swap's two asks leaves each side its own encoder: the summary says so."""
    from rag_demo.ui.html import format_swap_summary

    a, b = (ui_engine.ask(QUESTION, kb=kb, k=3, variants="token") for kb in (KB, "nq-counterfactual"))
    assert "different question encoders" not in format_swap_summary(a, b)
    stepped = format_swap_summary(replace(a, question_encoder="trained on this page (RAG-Token, 4 steps)"),
                                  replace(b, question_encoder="trained on this page (RAG-Token, 5 steps)"))
    assert ("different question encoders, nq-wiki with trained on this page (RAG-Token, 4 steps) and "
            "nq-counterfactual with trained on this page (RAG-Token, 5 steps)") in stepped
