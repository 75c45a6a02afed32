"""RAG's marginalizations and document posteriors as pure torch functions (paper, section 2).

Shapes: B questions, K retrieved passages, T answer tokens, V vocabulary.
`scores` are raw retriever scores; `logprobs` are normalized log-probabilities.
`token_logprobs[b, z, t]` = log p(y_t | x, z, y<t), the generator's log-prob of the t-th
answer token when conditioned on passage z. Padding positions must hold 0 (log 1), so that
sums over tokens ignore them; `mask` says which positions are real.
"""

from __future__ import annotations

import torch


def doc_logprobs(scores: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
    """log p(z|x): log-softmax of the top-k scores, renormalized over those k only.

    scores: (B, K) raw inner products -> (B, K).

    >>> doc_logprobs(torch.tensor([[0.0, 0.0]])).exp()
    tensor([[0.5000, 0.5000]])
    """
    return torch.log_softmax(scores.float() * scale, dim=-1)


def doc_logprobs_with_memory(logits: torch.Tensor, memory_logit: torch.Tensor | float) -> torch.Tensor:
    """log p(z|x) over the K passages and the generator's memory ∅, the last column: a log-softmax of
    the passages' logits with ∅'s own logit beside them, on the same scale. ∅ takes the weight when no
    passage's logit comes near it; the passages keep their order and their ratios to one another.

    logits: (B, K) the retriever's logits (scale * score, plus any lexical part); memory_logit: a float
    or (B,) -> (B, K + 1).

    >>> doc_logprobs_with_memory(torch.tensor([[2.0, 0.0]]), 2.0).exp().round(decimals=3)
    tensor([[0.4680, 0.0630, 0.4680]])
    """
    logits = logits.float()
    memory = torch.as_tensor(memory_logit, dtype=logits.dtype, device=logits.device).expand(logits.shape[0])
    return torch.log_softmax(torch.cat([logits, memory[:, None]], dim=1), dim=-1)


def next_token_marginal(step_logprobs: torch.Tensor, doc_lp: torch.Tensor) -> torch.Tensor:
    """RAG-Token's next-token distribution: log sum_z p(z|x) p(y|x,z,y<i).

    step_logprobs: (B, K, V), doc_lp: (B, K) -> (B, V).
    """
    return torch.logsumexp(step_logprobs + doc_lp.unsqueeze(-1), dim=1)


def rag_token_token_logprobs(token_logprobs: torch.Tensor, doc_lp: torch.Tensor) -> torch.Tensor:
    """Per-token marginals under RAG-Token: log sum_z p(z|x) p(y_t|x,z,y<t).

    token_logprobs: (B, K, T), doc_lp: (B, K) -> (B, T).
    """
    return torch.logsumexp(token_logprobs + doc_lp.unsqueeze(-1), dim=1)


def rag_token_logprob(token_logprobs: torch.Tensor, doc_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """RAG-Token: log p(y|x) = sum_t log sum_z p(z|x) p(y_t|x,z,y<t).

    token_logprobs: (B, K, T), doc_lp: (B, K), mask: (B, T) bool -> (B,).
    """
    return (rag_token_token_logprobs(token_logprobs, doc_lp) * mask).sum(-1)


def rag_sequence_logprob(token_logprobs: torch.Tensor, doc_lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """RAG-Sequence: log p(y|x) = log sum_z p(z|x) prod_t p(y_t|x,z,y<t).

    token_logprobs: (B, K, T), doc_lp: (B, K), mask: (B, T) bool -> (B,).
    """
    per_doc = (token_logprobs * mask.unsqueeze(1)).sum(-1)  # (B, K) log p(y|x,z)
    return torch.logsumexp(per_doc + doc_lp, dim=-1)


def rag_token_posteriors(token_logprobs: torch.Tensor, doc_lp: torch.Tensor) -> torch.Tensor:
    """Figure 2's posterior p(z|x,y_t,y<t) ∝ p(z|x) p(y_t|x,z,y<t), one row per token.

    token_logprobs: (B, K, T), doc_lp: (B, K) -> (B, T, K), each row sums to 1.
    """
    joint = token_logprobs + doc_lp.unsqueeze(-1)  # (B, K, T)
    return torch.softmax(joint, dim=1).transpose(1, 2)


def running_logposteriors(token_logprobs: torch.Tensor, doc_lp: torch.Tensor) -> torch.Tensor:
    """RAG-Sequence's log p(z|x,y<=t) ∝ log p(z|x) + sum_{j<=t} log p(y_j|x,z,y<j).

    token_logprobs: (B, K, T), doc_lp: (B, K) -> (B, T, K); the last real row is log p(z|x,y).
    """
    joint = doc_lp.unsqueeze(-1) + token_logprobs.cumsum(-1)  # (B, K, T)
    return torch.log_softmax(joint, dim=1).transpose(1, 2)


def rag_sequence_posteriors(token_logprobs: torch.Tensor, doc_lp: torch.Tensor) -> torch.Tensor:
    """Running posterior p(z|x,y<=t) for RAG-Sequence. (B, K, T), (B, K) -> (B, T, K)."""
    return running_logposteriors(token_logprobs, doc_lp).exp()


def rag_sequence_token_logprobs(token_logprobs: torch.Tensor, doc_lp: torch.Tensor) -> torch.Tensor:
    """RAG-Sequence's per-token conditionals log p(y_t|x,y<t) = log sum_z p(z|x,y<t) p(y_t|x,z,y<t).

    They telescope: summed over the real tokens they give `rag_sequence_logprob`.
    token_logprobs: (B, K, T), doc_lp: (B, K) -> (B, T).
    """
    before = torch.cat([doc_lp.unsqueeze(1), running_logposteriors(token_logprobs, doc_lp)[:, :-1]], dim=1)  # (B, T, K)
    return torch.logsumexp(before + token_logprobs.transpose(1, 2), dim=-1)
