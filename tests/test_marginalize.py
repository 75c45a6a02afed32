"""The marginalizations against identities and a brute-force loop over passages."""

from __future__ import annotations

import math

import pytest
import torch

from rag_demo import marginalize as M


def _random(batch=2, docs=4, length=5, vocab=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    step = torch.randn(batch, docs, length, vocab, generator=g).log_softmax(-1)  # (B, K, T, V)
    targets = torch.randint(vocab, (batch, length), generator=g)
    token_lp = step.gather(-1, targets[:, None, :, None].expand(-1, docs, -1, 1)).squeeze(-1)  # (B, K, T)
    doc_lp = M.doc_logprobs(torch.randn(batch, docs, generator=g), scale=3.0)
    return step, targets, token_lp, doc_lp


def test_doc_logprobs_is_softmax_over_top_k_with_scale():
    scores = torch.tensor([[1.0, 0.5, -0.2]])
    expected = [math.exp(20 * s) for s in scores[0].tolist()]
    expected = [e / sum(expected) for e in expected]
    assert M.doc_logprobs(scores, scale=20).exp()[0].tolist() == pytest.approx(expected, rel=1e-5)


def test_brute_force_loop_gives_the_same_numbers():
    _, _, token_lp, doc_lp = _random()
    mask = torch.ones(token_lp.shape[0], token_lp.shape[2], dtype=torch.bool)
    B, K, T = token_lp.shape
    for b in range(B):
        seq = sum(math.exp(doc_lp[b, z]) * math.prod(math.exp(token_lp[b, z, t]) for t in range(T)) for z in range(K))
        tok = math.prod(sum(math.exp(doc_lp[b, z] + token_lp[b, z, t]) for z in range(K)) for t in range(T))
        assert float(M.rag_sequence_logprob(token_lp, doc_lp, mask)[b]) == pytest.approx(math.log(seq), rel=1e-5)
        assert float(M.rag_token_logprob(token_lp, doc_lp, mask)[b]) == pytest.approx(math.log(tok), rel=1e-5)
        for t in range(T):
            joint = [math.exp(doc_lp[b, z] + token_lp[b, z, t]) for z in range(K)]
            assert M.rag_token_posteriors(token_lp, doc_lp)[b, t].tolist() == pytest.approx([j / sum(joint) for j in joint], rel=1e-4)
            running = [math.exp(doc_lp[b, z] + token_lp[b, z, : t + 1].sum()) for z in range(K)]
            assert M.rag_sequence_posteriors(token_lp, doc_lp)[b, t].tolist() == pytest.approx([r / sum(running) for r in running], rel=1e-4)


def test_sequence_marginal_over_the_finders_is_the_full_one_with_the_others_at_zero():
    """Fast decoding scores an answer over the passages whose beams found it: that is the full
    RAG-Sequence marginal with p(y|x,z) = 0 for every other passage."""
    _, _, token_lp, doc_lp = _random(batch=1, docs=4, seed=7)
    mask = torch.ones(1, token_lp.shape[2], dtype=torch.bool)
    finders, others = [0, 2], [1, 3]
    zeroed = token_lp.clone()
    zeroed[:, others] = float("-inf")  # log 0
    assert torch.allclose(M.rag_sequence_logprob(token_lp[:, finders], doc_lp[:, finders], mask),
                          M.rag_sequence_logprob(zeroed, doc_lp, mask), atol=1e-5)


def test_posteriors_are_distributions():
    _, _, token_lp, doc_lp = _random(seed=3)
    for post in (M.rag_token_posteriors(token_lp, doc_lp), M.rag_sequence_posteriors(token_lp, doc_lp)):
        assert torch.allclose(post.sum(-1), torch.ones(post.shape[:2]), atol=1e-5)
        assert (post >= 0).all()


def test_one_passage_reduces_both_variants_to_the_generator():
    _, _, token_lp, _ = _random(docs=1)
    doc_lp = torch.zeros(token_lp.shape[0], 1)
    mask = torch.ones(token_lp.shape[0], token_lp.shape[2], dtype=torch.bool)
    plain = token_lp[:, 0].sum(-1)
    assert torch.allclose(M.rag_sequence_logprob(token_lp, doc_lp, mask), plain, atol=1e-5)
    assert torch.allclose(M.rag_token_logprob(token_lp, doc_lp, mask), plain, atol=1e-5)


def test_one_token_answer_makes_the_variants_agree():
    _, _, token_lp, doc_lp = _random(length=1)
    mask = torch.ones(token_lp.shape[0], 1, dtype=torch.bool)
    assert torch.allclose(M.rag_sequence_logprob(token_lp, doc_lp, mask), M.rag_token_logprob(token_lp, doc_lp, mask), atol=1e-5)
    assert torch.allclose(M.rag_token_posteriors(token_lp, doc_lp), M.rag_sequence_posteriors(token_lp, doc_lp), atol=1e-6)


def test_per_token_logprobs_sum_to_the_answer_logprob():
    _, _, token_lp, doc_lp = _random(seed=5)
    mask = torch.ones(token_lp.shape[0], token_lp.shape[2], dtype=torch.bool)
    assert torch.allclose(M.rag_sequence_token_logprobs(token_lp, doc_lp).sum(-1), M.rag_sequence_logprob(token_lp, doc_lp, mask), atol=1e-4)
    assert torch.allclose(M.rag_token_token_logprobs(token_lp, doc_lp).sum(-1), M.rag_token_logprob(token_lp, doc_lp, mask), atol=1e-4)


def test_next_token_marginal_is_a_distribution_matching_per_token_marginal():
    step, targets, token_lp, doc_lp = _random()
    marginal = M.next_token_marginal(step[:, :, 0], doc_lp)  # (B, V)
    assert torch.allclose(marginal.exp().sum(-1), torch.ones(step.shape[0]), atol=1e-5)
    assert torch.allclose(marginal.gather(1, targets[:, :1]).squeeze(1), M.rag_token_token_logprobs(token_lp, doc_lp)[:, 0], atol=1e-5)


def test_padding_positions_are_ignored():
    _, _, token_lp, doc_lp = _random(length=4)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    padded = token_lp * mask[:, None, :]
    short = token_lp[:1, :, :2]
    assert torch.allclose(M.rag_sequence_logprob(padded, doc_lp, mask)[:1],
                          M.rag_sequence_logprob(short, doc_lp[:1], torch.ones(1, 2, dtype=torch.bool)), atol=1e-5)


def test_copy_spans_allows_only_runs_of_a_source():
    from rag_demo.generation.decoding import NEG, CopySpans

    stop = frozenset({0})
    copy = CopySpans([[5, 6, 7, 5, 8], [9, 6, 7, 4]], prefix_len=1, stop_ids=stop)
    assert copy.allowed([]).tolist() == [4, 5, 6, 7, 8, 9]
    assert copy.allowed([6]).tolist() == [0, 7]  # 6 is followed by 7 in both; a copied run may stop
    assert copy.allowed([6, 7]).tolist() == [0, 4, 5]  # each source's continuation
    assert copy.allowed([5, 8]).tolist() == [0]  # the end of a source: only stop
    assert copy.allowed([7, 6]).tolist() == [0]  # not a run of any source: only stop
    scores = torch.zeros(2, 10)
    out = copy(torch.tensor([[3, 6, 7], [3, 5, 8]]), scores)
    assert (out[0] == 0).nonzero().flatten().tolist() == [0, 4, 5] and out[0, 9] == NEG
    assert (out[1] == 0).nonzero().flatten().tolist() == [0]
    done = copy(torch.tensor([[3, 6, 0]]), torch.ones(1, 10))  # finished rows are left alone
    assert torch.equal(done, torch.ones(1, 10))


def test_greedy_with_copy_spans_copies_a_passage_run(tiny_engine):
    """The tiny BART answers free text; with the constraint, its answer is a run of the passage tokens."""
    from rag_demo.generation import decoding

    gen = tiny_engine.generator
    source = gen.tokenizer(" Lake Baikal is the deepest lake", add_special_tokens=False)["input_ids"]
    prefix = gen.generation_prefix()
    state = gen.start([gen.format_input("how deep is baikal", None)], prefix)
    stops = frozenset(gen.eos_ids)
    free = decoding.greedy(gen, gen.fork(state, torch.arange(1)), groups=1, doc_lp=None, prefix=prefix, max_new_tokens=6,
                           stop_ids=stops)[0]
    copied = decoding.greedy(gen, state, groups=1, doc_lp=None, prefix=prefix, max_new_tokens=6, stop_ids=stops,
                             copy_from=[source])[0]
    ids = [t for t in copied.ids if t not in stops]
    assert ids and any(source[i : i + len(ids)] == ids for i in range(len(source)))
    assert list(free.ids) != list(copied.ids)
