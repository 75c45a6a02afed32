"""The causal-LM generator path: left padding, caches and decoding against plain full forwards."""

from __future__ import annotations

import math

import pytest
import torch

from rag_demo.generation.generator import CausalGenerator
from rag_demo.generation.prompts import NO_ANSWER
from rag_demo.generation.teacher_forcing import rows_logprobs

QUESTION = "who wrote a farewell to arms"


def _full_forward_logprobs(model, tokenizer, prompt: str, continuation: list[int]) -> list[float]:
    """log p(continuation | prompt) from one unpadded forward without a cache."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    full = torch.cat([ids, torch.tensor([continuation])], dim=1)
    with torch.no_grad():
        logits = model(full).logits[0, ids.shape[1] - 1 : -1]
    return logits.log_softmax(-1).gather(1, torch.tensor(continuation)[:, None]).squeeze(1).tolist()


def test_left_padded_batch_equals_single_prompts(causal_engine):
    gen = causal_engine.generator
    result = causal_engine.score(QUESTION, "ernest hemingway", k=4)
    target = gen.answer_target("ernest hemingway")
    texts = causal_engine._inputs(causal_engine.retrieve(QUESTION, k=4))
    assert len({len(gen.tokenizer(t)["input_ids"]) for t in texts}) > 1  # prompts really differ in length
    for z, text in enumerate(texts):
        direct = _full_forward_logprobs(gen.model, gen.tokenizer, text, list(target.ids))
        assert [row[z] for row in result.variants["token"].doc_token_logprobs] == pytest.approx(direct, abs=1e-4)


def test_score_ends_the_answer_as_rag_token_likes_best(causal_engine):
    from rag_demo.marginalize import rag_token_logprob

    gen = causal_engine.generator
    targets = gen.answer_targets("ernest hemingway")
    assert len(targets) >= 2 and len({t.ids[:-1] for t in targets}) == 1 and all(t.ids[-1] in gen.stop_ids for t in targets)
    retrieval = causal_engine.retrieve(QUESTION, k=4)
    state = gen.start(causal_engine._inputs(retrieval), gen.generation_prefix())
    per_target = rows_logprobs(causal_engine.generator, state, [t.ids for t in targets], [list(range(4))] * len(targets))
    totals = [float(rag_token_logprob(lps[None], retrieval.doc_lp[None], torch.ones(1, lps.shape[1], dtype=torch.bool)))
              for lps in per_target]
    best = max(range(len(targets)), key=totals.__getitem__)
    scored = causal_engine.score(QUESTION, "ernest hemingway", k=4).variants["token"]
    assert scored.token_ids == targets[best].ids
    assert scored.logprob == pytest.approx(totals[best], abs=1e-4)


def test_rag_token_greedy_equals_a_loop_of_full_forwards(causal_engine):
    from rag_demo.marginalize import next_token_marginal

    gen = causal_engine.generator
    new_tokens = 6
    result = causal_engine.ask(QUESTION, k=3, variants=("token",), max_new_tokens=new_tokens, closed_book=False)
    retrieval = causal_engine.retrieve(QUESTION, k=3)
    texts = causal_engine._inputs(retrieval)
    generated: list[int] = []
    for _ in range(new_tokens):
        rows = []
        for text in texts:
            ids = gen.tokenizer(text)["input_ids"] + generated
            with torch.no_grad():
                rows.append(gen.model(torch.tensor([ids])).logits[0, -1].log_softmax(-1))
        token = int(next_token_marginal(torch.stack(rows)[None], retrieval.doc_lp[None])[0].argmax())
        generated.append(token)
        if token in gen.stop_ids:
            break
    assert list(result.variants["token"].token_ids) == generated


def test_beams_and_sequence_decoding_run_on_causal(causal_engine):
    result = causal_engine.ask(QUESTION, k=3, num_beams=2, max_new_tokens=5, sequence_decoding="fast")
    for variant in result.variants.values():
        assert 1 <= len(variant.token_ids) <= 5
        assert all(abs(sum(row) - 1) < 1e-5 for row in variant.posteriors)
    assert result.closed_book is not None


def test_long_passage_is_cut_to_fit_the_prompt(causal_engine):
    from rag_demo.retrieval.corpus import Passage

    from dataclasses import replace

    from rag_demo.generation import prompts

    base = causal_engine.generator
    bare = base.count_input_tokens(prompts.rag_prompt(QUESTION, "Long", ""))
    gen = CausalGenerator(base.model, base.tokenizer, replace(base.config, max_prompt_tokens=bare + 40), name="tiny")
    text = gen.format_input(QUESTION, Passage("Long", "word " * 2000))
    assert bare + 30 <= gen.count_input_tokens(text) <= bare + 42
    assert text.endswith(f"Question: {QUESTION}\nAnswer:")


def test_few_shot_block_is_computed_once_and_shared(causal_engine):
    gen = causal_engine.generator
    texts = causal_engine._inputs(causal_engine.retrieve(QUESTION, k=3))
    rows = [gen.tokenizer(t)["input_ids"] for t in texts]
    shared, cache = gen._shared_prefix(rows)
    assert len(shared) > 50 and cache.get_seq_length() == len(shared)
    closed = [gen.tokenizer(gen.format_input(QUESTION, None))["input_ids"]]
    assert len(gen._shared_prefix(closed)[0]) > 20


def test_teacher_forcing_in_slices_equals_one_pass(causal_engine, monkeypatch):
    from rag_demo.generation import generator as generator_module

    gen = causal_engine.generator
    retrieval = causal_engine.retrieve(QUESTION, k=4)
    state = gen.start(causal_engine._inputs(retrieval), gen.generation_prefix())
    targets = [gen.answer_target(a).ids for a in ("ernest hemingway", "mark twain", "a")]
    rows = [list(range(4))] * len(targets)
    whole = rows_logprobs(causal_engine.generator, state, targets, rows)
    monkeypatch.setattr(generator_module, "CONTINUATION_BYTES", 1)  # one pair per forward
    sliced = rows_logprobs(causal_engine.generator, state, targets, rows)
    assert len(targets[0]) > 2 and len(targets[2]) < len(targets[0])  # padded pairs are part of the check
    for a, b in zip(whole, sliced):
        assert torch.allclose(a, b, atol=1e-5)


def test_row_bytes_counts_every_layer_of_the_cache(causal_engine):
    from rag_demo.generation.decode_state import row_bytes

    gen = causal_engine.generator
    state = gen.start(causal_engine._inputs(causal_engine.retrieve(QUESTION, k=3)), gen.generation_prefix())
    config = gen.model.config
    positions = state.attention_mask.shape[1]
    head_dim = config.hidden_size // config.num_attention_heads
    # keys and values, every layer, float32
    assert row_bytes(state) == 2 * config.num_hidden_layers * config.num_key_value_heads * positions * head_dim * 4


def test_no_answer_marker_never_begins_an_answer(causal_engine):
    gen = causal_engine.generator
    assert gen.no_answer_ids == frozenset()  # a reader never trained on distractors: nothing is banned
    gen.reads_no_answer = True
    try:
        assert gen.no_answer_ids == frozenset(gen.answer_target(NO_ANSWER).ids[:1])
        free = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False)
        firsts = {free.variants[v].token_ids[0] for v in ("token", "sequence")}
        gen.__dict__["_no_answer_first"] = frozenset(firsts)  # as if the reader said "no answer" where it now answers
        banned = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False)
        beams = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, num_beams=2, closed_book=False)
    finally:
        gen.reads_no_answer = False
        gen.__dict__.pop("_no_answer_first", None)
    assert causal_engine.ask(QUESTION, k=3, max_new_tokens=1, closed_book=False).no_answer == ()
    first_probs = {free.variants[v].token_ids[0]: [math.exp(row) for row in free.variants[v].doc_token_logprobs[0]]
                   for v in ("token", "sequence")}
    expected = [sum(probs[z] for probs in first_probs.values()) for z in range(3)]
    assert banned.no_answer == pytest.approx(expected, rel=1e-4)  # what each passage gave the marker's first token
    assert len(free.no_answer) == 3 and all(0 <= p <= 1 for p in free.no_answer)
    for result in (banned, beams):
        for variant in result.variants.values():
            assert variant.token_ids[0] not in firsts
            # the reported probabilities stay the model's own: the ban only steers the choice
            assert sum(variant.token_logprobs) == pytest.approx(variant.logprob, abs=1e-4)
