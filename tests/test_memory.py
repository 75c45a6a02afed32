"""The generator's memory as a source beside the passages: p(z|x) over k + 1, both variants marginalized
over it exactly as over a passage, checked against full forwards computed here without the engine."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from rag_demo.generation import adapters
from rag_demo.config import MemoryConfig
from rag_demo.retrieval.corpus import Passage
from rag_demo.errors import InputError
from tests.ui_engine import QUESTIONS, make_ui_engine



@pytest.fixture(scope="module", params=["adapter", "base"])
def engine(request, tmp_path_factory, one_torch_thread):
    """An engine whose generator reads with a perturbed adapter (memory's row then steps apart, with the base
    weights), or with the base weights (memory's row then joins the passages' batch, `decode_state.join_rows`);
    memory's logit is the questions' mean top passage logit, so that memory takes a share of p(z|x),
    neither none nor all."""
    engine = make_ui_engine(tmp_path_factory.mktemp("memory"))
    if request.param == "adapter":
        adapters.add_adapters(engine.generator.model, adapters.AdapterShape(rank=4, alpha=8))
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for name, parameter in adapters.adapter_parameters(engine.generator.model).items():
                if name.endswith("lora_up"):
                    parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    theta = sum(engine.retrieve(q, k=3).passages[0].logit for q in QUESTIONS[:4]) / 4
    engine.config = replace(engine.config, memory=MemoryConfig(logit=theta))
    return engine


def _forward_logprobs(model, tokenizer, prompt: str, continuation: list[int]) -> list[float]:
    """log p(continuation | prompt), one unpadded forward, no cache."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    full = torch.cat([ids, torch.tensor([continuation], dtype=torch.long)], dim=1)
    with torch.no_grad():
        logits = model(full).logits[0, ids.shape[1] - 1 : -1]
    return logits.log_softmax(-1).gather(1, torch.tensor(continuation)[:, None]).squeeze(1).tolist()


def _sources(engine, question: str, result, ids: list[int]) -> tuple[list[list[float]], list[float]]:
    """Per source (the passages, then memory), the tokens' log-probs by full forwards; and p(z|x) by hand."""
    gen = engine.generator
    prompts = [gen.format_input(question, Passage(p.title, p.text)) for p in result.passages]
    rows = [_forward_logprobs(gen.model, gen.tokenizer, text, ids) for text in prompts]
    with adapters.base_weights(gen.model):
        rows.append(_forward_logprobs(gen.model, gen.tokenizer, gen.format_input(question, None), ids))
    logits = [p.logit for p in result.passages] + [engine.config.memory.logit]
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    prior = [w / sum(weights) for w in weights]
    return rows, prior


def test_p_z_given_x_spreads_over_the_passages_and_memory(engine):
    result = engine.ask(QUESTIONS[0], k=3, variants=("token",), closed_book=False)
    _, prior = _sources(engine, QUESTIONS[0], result, [])
    assert [p.prob for p in result.passages] == pytest.approx(prior[:-1], abs=1e-6)
    assert result.memory_prob == pytest.approx(prior[-1], abs=1e-6) and 0.01 < result.memory_prob < 0.99
    assert result.memory_logit == engine.config.memory.logit
    assert sum(p.prob for p in result.passages) + result.memory_prob == pytest.approx(1, abs=1e-6)


@pytest.mark.parametrize("question", QUESTIONS[:4])
def test_both_variants_marginalize_over_memory_as_over_a_passage(engine, question):
    result = engine.ask(question, k=3, closed_book=True)
    for name, variant in result.variants.items():
        ids = list(variant.token_ids)
        rows, prior = _sources(engine, question, result, ids)
        joint = [[math.log(prior[z]) + rows[z][t] for z in range(len(rows))] for t in range(len(ids))]
        if name == "token":  # p(z | x, y_t, y<t) ∝ p(z|x) p(y_t | x, z, y<t); p(y|x) = prod_t sum_z
            per_token = [math.log(sum(math.exp(j) for j in row)) for row in joint]
            posteriors = [[math.exp(j - lse) for j in row] for row, lse in zip(joint, per_token)]
            logprob = sum(per_token)
        else:  # running posterior p(z | x, y<=t); p(y|x) = sum_z p(z|x) prod_t p(y_t | x, z, y<t)
            running = [[math.log(prior[z]) + sum(rows[z][: t + 1]) for z in range(len(rows))] for t in range(len(ids))]
            posteriors = [[math.exp(j - math.log(sum(math.exp(i) for i in row))) for j in row] for row in running]
            logprob = math.log(sum(math.exp(j) for j in running[-1]))
        assert variant.logprob == pytest.approx(logprob, abs=1e-4)
        assert [list(row) for row in variant.posteriors] == [pytest.approx(row[:-1], abs=1e-4) for row in posteriors]
        assert list(variant.memory_posteriors) == pytest.approx([row[-1] for row in posteriors], abs=1e-4)
        assert [list(row) for row in variant.doc_token_logprobs] == [
            pytest.approx([rows[z][t] for z in range(len(rows) - 1)], abs=1e-4) for t in range(len(ids))]
        assert list(variant.closed_book_token_logprobs) == pytest.approx(rows[-1], abs=1e-4)  # the memory's own


def test_rag_token_decodes_greedily_on_the_marginal_over_passages_and_memory(engine):
    gen = engine.generator
    for question in QUESTIONS[:4]:
        result = engine.ask(question, k=3, variants=("token",), closed_book=False)
        _, prior = _sources(engine, question, result, [])
        prompts = [gen.format_input(question, Passage(p.title, p.text)) for p in result.passages]
        ids: list[int] = []
        for _ in range(engine.config.decoding.max_new_tokens):  # each step's next token from full forwards
            step = []
            for text in prompts:
                full = gen.tokenizer(text, return_tensors="pt")["input_ids"]
                full = torch.cat([full, torch.tensor([ids], dtype=torch.long)], dim=1)
                with torch.no_grad():
                    step.append(gen.model(full).logits[0, -1].log_softmax(-1))
            full = gen.tokenizer(gen.format_input(question, None), return_tensors="pt")["input_ids"]
            full = torch.cat([full, torch.tensor([ids], dtype=torch.long)], dim=1)
            with torch.no_grad(), adapters.base_weights(gen.model):
                step.append(gen.model(full).logits[0, -1].log_softmax(-1))
            marginal = torch.logsumexp(torch.stack(step) + torch.tensor(prior).log()[:, None], dim=0)
            best = int(marginal.argmax())
            ids.append(best)
            if best in gen.stop_ids:
                break
        assert list(result.variants["token"].token_ids) == ids


def test_rag_sequence_weighs_the_closed_book_answer_as_a_candidate(engine):
    for question in QUESTIONS[:4]:
        result = engine.ask(question, k=3, closed_book=True)
        candidates = dict(result.variants["sequence"].candidates)
        assert result.closed_book.answer in candidates
        best = max(candidates.values())
        assert result.variants["sequence"].logprob == pytest.approx(best, abs=1e-5)


def test_memory_off_is_the_papers_k_passages_and_an_extreme_logit_is_one_source(engine):
    question = QUESTIONS[2]
    off = engine.ask(question, k=3, memory=False)
    assert off.memory_prob is None and off.memory_logit is None
    assert all(v.memory_posteriors == () for v in off.variants.values())
    assert sum(p.prob for p in off.passages) == pytest.approx(1, abs=1e-6)
    for row in off.variants["token"].posteriors:
        assert sum(row) == pytest.approx(1, abs=1e-5)
    config = engine.config
    try:
        engine.config = replace(config, memory=MemoryConfig(logit=-1e4))
        lost = engine.ask(question, k=3)
        engine.config = replace(config, memory=MemoryConfig(logit=1e4))
        only = engine.ask(question, k=3)
    finally:
        engine.config = config
    assert lost.variants["token"].token_ids == off.variants["token"].token_ids
    assert lost.variants["token"].logprob == pytest.approx(off.variants["token"].logprob, abs=1e-4)
    assert only.variants["token"].answer == only.closed_book.answer == only.variants["sequence"].answer
    assert only.variants["token"].logprob == pytest.approx(only.closed_book.logprob, abs=1e-4)


def test_score_gives_an_asked_answer_the_probability_ask_showed(engine):
    question = QUESTIONS[0]
    asked = engine.ask(question, k=3, variants=("token",), closed_book=False).variants["token"]
    scored = engine.score(question, asked.answer, k=3, variants=("token",))
    token = scored.variants["token"]
    if token.token_ids == asked.token_ids:
        assert token.logprob == pytest.approx(asked.logprob, abs=1e-4)
        assert token.memory_posteriors == pytest.approx(asked.memory_posteriors, abs=1e-4)
    assert scored.memory_prob == pytest.approx(1 - sum(p.prob for p in scored.passages), abs=1e-6)


def test_memory_asked_for_where_no_logit_is_fitted_is_refused(tmp_path, one_torch_thread):
    plain = make_ui_engine(tmp_path)  # a tiny encoder and generator: no fitted logit
    assert plain.memory_logit() is None
    assert plain.ask(QUESTIONS[0], k=2).memory_prob is None
    with pytest.raises(InputError, match="memory"):
        plain.ask(QUESTIONS[0], k=2, memory=True)


def test_the_fitted_logits_serve_only_the_setup_they_were_fitted_for(tmp_path, monkeypatch, one_torch_thread):
    """DEFAULT_MEMORY_LOGITS were fitted with the default encoder's packaged question side and the base
    generator: a fine-tuned question side or a reading adapter moves the scales, so memory is then off
    unless a logit is given."""
    from rag_demo import memory as parametric_memory
    from rag_demo.config import DEFAULT_ENCODER, DEFAULT_GENERATOR

    plain = make_ui_engine(tmp_path)
    monkeypatch.setattr(parametric_memory, "DEFAULT_MEMORY_LOGITS", {"dense": 3.0, "bm25": 1.0})
    monkeypatch.setattr(plain.encoder, "name", DEFAULT_ENCODER)
    monkeypatch.setattr(plain.generator, "name", DEFAULT_GENERATOR)
    assert plain.memory_logit("dense") == 3.0 and plain.memory_logit("bm25") == 1.0
    assert plain.ask(QUESTIONS[0], k=2, retriever="dense").memory_logit == 3.0
    # a base of the visitor's own: θ would outweigh its passages, whose logits it was never fitted on
    own = plain.build_kb("mine", [Passage("Okafor", "Mr. Okafor is the librarian of the school.")])
    assert plain.ask(QUESTIONS[0], kb=own, k=1, retriever="dense").memory_prob is None
    with pytest.raises(InputError, match="no fitted logit for the generator's memory on mine"):
        plain.ask(QUESTIONS[0], kb=own, k=1, retriever="dense", memory=True)
    plain.config = replace(plain.config, memory=MemoryConfig(logit=0.5))
    assert plain.ask(QUESTIONS[0], kb=own, k=1, retriever="dense").memory_logit == 0.5  # a logit given serves it
    plain.config = replace(plain.config, memory=MemoryConfig())
    monkeypatch.setattr(plain.encoder, "question_weights", "minilm-questions-0123")
    assert plain.memory_logit("dense") is None
    monkeypatch.setattr(plain.encoder, "question_weights", "")
    adapters.add_adapters(plain.generator.model, adapters.AdapterShape(rank=2, alpha=4))
    assert plain.generator.has_adapter and plain.memory_logit("dense") is None
    plain.config = replace(plain.config, memory=MemoryConfig(logit=0.5))
    assert plain.memory_logit("dense") == 0.5  # a logit given serves any setup
    plain.config = replace(plain.config, memory=MemoryConfig(enabled=False, logit=0.5))
    assert plain.memory_logit("dense") is None


def test_the_memory_logit_benchmark_recomputes_the_marginal_likelihood():
    """benchmarks.memory_logit: log Σ_z p_θ(z|x) p(A|x,z) over k passages and ∅, by hand."""
    from benchmarks.memory_logit import mean_loglik

    logits = {"dense": torch.tensor([2.0, 0.0])}
    records = [(logits, {"dense": [7, 3]}, {7: math.log(0.5), 3: math.log(0.1)}, math.log(0.9))]
    theta = 1.0
    weights = [math.exp(2.0), math.exp(0.0), math.exp(theta)]
    prior = [w / sum(weights) for w in weights]
    expected = math.log(prior[0] * 0.5 + prior[1] * 0.1 + prior[2] * 0.9)
    loglik, memory = mean_loglik(records, "dense", theta)
    assert loglik == pytest.approx(expected, abs=1e-6) and memory == pytest.approx(prior[2], abs=1e-6)
    off, _ = mean_loglik(records, "dense", None)
    assert off == pytest.approx(math.log((math.e ** 2 * 0.5 + 0.1) / (math.e ** 2 + 1)), abs=1e-6)


def test_memory_joins_the_passages_batch_only_where_they_read_with_the_base_weights(engine, monkeypatch):
    """The joined batch and memory's row stepped apart give the same answers and numbers."""
    from rag_demo import engine as engine_module

    joins = []
    join = engine_module.join_rows
    monkeypatch.setattr(engine_module, "join_rows", lambda *states: joins.append(1) or join(*states))
    together = engine.ask(QUESTIONS[1], k=3)
    assert bool(joins) == (not engine.generator.has_adapter)
    monkeypatch.setattr(engine_module, "join_rows", lambda *states: None)  # always apart
    apart = engine.ask(QUESTIONS[1], k=3)
    for name in together.variants:
        a, b = together.variants[name], apart.variants[name]
        assert a.token_ids == b.token_ids and a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert list(a.memory_posteriors) == pytest.approx(list(b.memory_posteriors), abs=1e-4)
    assert together.closed_book.answer == apart.closed_book.answer


def _retrieval(scores, *, retriever="hybrid", scale=20.0):
    from rag_demo.results import Retrieval, RetrievedPassage

    passages = tuple(RetrievedPassage(rank=i + 1, id=i, title=f"T{i}", text="t", score=s, prob=0.0, logit=scale * s + 3.0)
                     for i, s in enumerate(scores))
    return Retrieval(kb="mine", passages=passages, doc_lp=torch.zeros(len(scores)), generator_question="q",
                     retriever=retriever, scale=scale)


def test_passages_far_from_the_question_are_said_to_be_so():
    """Where memory is no source, a notice names the best dense score when every passage's is below the floor."""
    from rag_demo.memory import poor_match_notice

    far = poor_match_notice(_retrieval([0.1, 0.05]), 0.3)
    assert len(far) == 1 and "best score 0.10" in far[0] and "0.30 or more" in far[0]
    # measured on the packaged bases: there an answer read from such passages is likely wrong; on a visitor's own
    # text, whose passages may mix subjects, the notice only asks to check them
    assert "check that a passage says the answer" in far[0] and "likely wrong" not in far[0]
    packaged = poor_match_notice(replace(_retrieval([0.1]), kb="wikipedia"), 0.3)
    assert len(packaged) == 1 and "likely wrong" in packaged[0]
    assert poor_match_notice(_retrieval([0.52]), 0.3) == ()  # a passage that answers: a visitor's note scored 0.52
    assert poor_match_notice(_retrieval([0.05, 0.31]), 0.3) == ()  # the best one counts, wherever it ranks
    assert poor_match_notice(_retrieval([0.29, 0.29, 0.29]), 0.3)  # many far passages are no closer than one
    assert poor_match_notice(_retrieval([0.1]), None) == ()  # no floor measured for this setup
    assert poor_match_notice(_retrieval([0.1], retriever="bm25", scale=0.2), 0.3) == ()  # BM25 has no dense score


def test_the_floor_holds_only_where_it_was_measured(tmp_path, monkeypatch):
    from rag_demo.config import DEFAULT_ENCODER, NO_MATCH_SCORE
    from rag_demo.memory import no_match_floor

    encoder = make_ui_engine(tmp_path).encoder
    assert no_match_floor(encoder, own_question_side=True) is None  # a tiny test encoder: its scores are its own
    monkeypatch.setattr(encoder, "name", DEFAULT_ENCODER)
    assert no_match_floor(encoder, own_question_side=True) == NO_MATCH_SCORE
    assert no_match_floor(encoder, own_question_side=False) is None  # a question side trained on the Train tab
    monkeypatch.setattr(encoder, "question_weights", "tuned")
    assert no_match_floor(encoder, own_question_side=True) is None


def test_an_ask_on_a_visitors_far_off_text_says_its_passages_match_poorly(tmp_path, monkeypatch, one_torch_thread):
    from rag_demo import memory as parametric_memory
    from rag_demo.config import DEFAULT_ENCODER

    plain = make_ui_engine(tmp_path)
    own = plain.build_kb("mine", [Passage("Okafor", "Mr. Okafor is the librarian of the school.")])
    monkeypatch.setattr(plain.encoder, "name", DEFAULT_ENCODER)
    for floor, said in ((1e6, True), (-1e6, False)):  # above any score, or below any
        monkeypatch.setattr(parametric_memory, "NO_MATCH_SCORE", floor)
        result = plain.ask(QUESTIONS[0], kb=own, k=1, retriever="dense", variants="token", closed_book=False, max_new_tokens=2)
        assert result.memory_prob is None
        assert any("no passage is close to the question" in notice for notice in result.notices) is said
        scored = plain.score(QUESTIONS[0], "Okafor", kb=own, k=1, retriever="dense")  # the Score tab says it too
        assert any("no passage is close to the question" in notice for notice in scored.notices) is said


def test_the_page_process_memory_share_equals_the_engines_softmax():
    """`/compare_json` says ∅'s share in plain floats (the page's process loads no torch); it must be the share
    `doc_logprobs_with_memory` gives the memory in an ask."""
    from rag_demo.marginalize import doc_logprobs_with_memory
    from rag_demo.results import memory_share

    for logits, theta in (([12.0, 10.5, 9.0], 13.0), ([3.0], -2.0), ([800.0, 799.0], 790.0)):
        expected = float(doc_logprobs_with_memory(torch.tensor([logits], dtype=torch.float64), theta)[0, -1].exp())
        assert memory_share(logits, theta) == pytest.approx(expected, rel=1e-6)  # the engine softmaxes in float32
