"""Decoding (paper, section 2.5) on top of the generator interface.

- RAG-Token: greedy or beam search on the marginal sum_z p(z|x) p(y_i|x,z,y<i).
- RAG-Sequence: beam search (or greedy) separately under each passage, then every distinct
  hypothesis is scored by the full marginal (thorough) or only where it was found (fast).

The beam search follows transformers' (`length_penalty`, its early-stop heuristic, candidates
of the top `num_beams` ranks only), so the same model and passages give the same answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .decode_state import DecodeState
from .generator import Generator
from ..marginalize import next_token_marginal
from ..progress import listed

NEG = -1.0e9  # transformers' "impossible" score; -inf would turn sums into NaN


@dataclass(frozen=True)
class Hypothesis:
    ids: tuple[int, ...]  # generated ids after the prefix, stop token included when produced
    score: float  # sum of (processed) log-probs divided by length ** length_penalty
    group: int  # which group (passage for RAG-Sequence) produced it
    # greedy only: (sources of the group, len(ids)) unprocessed log p(y_t | source, y<t), as teacher forcing
    # gives them: the group's rows, then the memory's when it is a source
    row_logprobs: torch.Tensor | None = None


def logits_processors(generator: Generator, *, prefix_len: int, max_new_tokens: int, generation_config=None,
                      copy_from: list[list[int]] | None = None, stop_ids: frozenset[int] = frozenset(),
                      barred_first: frozenset[int] = frozenset()):
    """The generation-config constraints transformers applies (forced BOS/EOS, min length, n-gram bans),
    then `CopySpans` over `copy_from` when answers must copy a passage. No answer begins with one of
    `barred_first` (first words of answers set aside, `restatements`) or with the no-answer marker."""
    from transformers import (
        ForcedBOSTokenLogitsProcessor,
        ForcedEOSTokenLogitsProcessor,
        LogitsProcessorList,
        MinLengthLogitsProcessor,
        NoRepeatNGramLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
    )

    config = generation_config or generator.model.generation_config
    eos = sorted(generator.eos_ids)
    max_length = prefix_len + max_new_tokens
    processors = LogitsProcessorList()
    if config.min_length and config.min_length > 0 and eos:
        processors.append(MinLengthLogitsProcessor(config.min_length, eos))
    if config.repetition_penalty not in (None, 1.0):
        processors.append(RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
    if config.no_repeat_ngram_size:
        processors.append(NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size))
    if config.forced_bos_token_id is not None:
        processors.append(ForcedBOSTokenLogitsProcessor(config.forced_bos_token_id))
    if config.forced_eos_token_id is not None:
        processors.append(ForcedEOSTokenLogitsProcessor(max_length, config.forced_eos_token_id))
    if generator.no_answer_ids or barred_first:
        processors.append(BarFirstWord(generator.no_answer_ids | barred_first, prefix_len=prefix_len,
                                       before=generator.special_ids))
    if copy_from is not None:
        processors.append(CopySpans(copy_from, prefix_len=prefix_len, stop_ids=stop_ids))
    return processors


class BarFirstWord:
    """A logits processor that keeps an answer's first word off `token_ids`: it masks them wherever
    everything generated after `prefix_len` so far is in `before` (special tokens a seq2seq decoder
    is made to begin with, such as BART's forced BOS)."""

    def __init__(self, token_ids: frozenset[int], *, prefix_len: int, before: frozenset[int]):
        self.token_ids = torch.tensor(sorted(token_ids), dtype=torch.long)
        self.prefix_len = prefix_len
        self.before = torch.tensor(sorted(before), dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[:, self.prefix_len :]
        first = torch.isin(generated, self.before).all(dim=1)  # (N,) no word generated yet
        if not bool(first.any()):
            return scores
        scores = scores.clone()
        rows = first.nonzero()[:, 0].to(scores.device)
        scores[rows[:, None], self.token_ids.to(scores.device)[None, :]] = NEG
        return scores


class CopySpans:
    """A logits processor that makes answers copy: the tokens generated after `prefix_len` must
    be a contiguous run of one of the `sources` (the retrieved passages as the generator reads
    them), and a stop token may follow only once at least one token was copied.

    It only masks the choice. Every probability the engine reports is still the model's own,
    teacher-forced afterwards, so p(y|x) and the posteriors stay exact for the chosen answer.
    """

    def __init__(self, sources: list[list[int]], *, prefix_len: int, stop_ids: frozenset[int]):
        self.sources = [np.asarray(source, dtype=np.int64) for source in sources if len(source)]
        self.prefix_len = prefix_len
        self.stop = np.asarray(sorted(stop_ids), dtype=np.int64)
        self.starts = np.unique(np.concatenate(self.sources)) if self.sources else np.zeros(0, dtype=np.int64)

    def allowed(self, generated: list[int]) -> np.ndarray:
        """Token ids that may come next after `generated`, ascending."""
        if not generated:
            return self.starts
        run = np.asarray(generated, dtype=np.int64)
        n = len(run)
        following, copied = [], False
        for source in self.sources:
            if len(source) < n:
                continue
            starts = np.flatnonzero((np.lib.stride_tricks.sliding_window_view(source, n) == run).all(axis=1))
            if starts.size:
                copied = True
                ends = starts + n
                following.append(source[ends[ends < len(source)]])
        if copied:
            following.append(self.stop)
        return np.unique(np.concatenate(following)) if following else self.stop

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """input_ids (N, L), scores (N, V) -> scores with every other token set to NEG."""
        masked = torch.full_like(scores, NEG)
        for row in range(input_ids.shape[0]):
            generated = input_ids[row, self.prefix_len :].tolist()
            if generated and generated[-1] in self.stop:  # finished: greedy repeats its last token, cut off later
                masked[row] = scores[row]
                continue
            ok = torch.from_numpy(self.allowed(generated)).to(scores.device)
            masked[row, ok] = scores[row, ok]
        return masked


class MemoryRows:
    """The generator's memory ∅ as a source beside the passages: closed-book rows (the question with no
    passage, read with the base weights), one per beam, stepped in lockstep with the passages' rows."""

    def __init__(self, generator: Generator, state: DecodeState):
        self.generator = generator
        self.state = state

    @property
    def logprobs(self) -> torch.Tensor:
        return self.state.logprobs  # (B, V)

    def select(self, rows: torch.Tensor) -> None:
        self.state = self.generator.select(self.state, rows)

    def advance(self, tokens: torch.Tensor) -> None:
        with self.generator.base_weights():
            self.state = self.generator.advance(self.state, tokens)


class _Search:
    """Step function of one decoding problem: G independent groups, B beams each."""

    def __init__(self, generator: Generator, state: DecodeState, groups: int, doc_lp: torch.Tensor | None,
                 memory: MemoryRows | None = None):
        self.generator = generator
        self.state = state
        self.groups = groups
        # (S,) for RAG-Token: rows are beam x passage, and with `memory` its rows (one per beam) are the
        # last source; None: one row per beam
        self.doc_lp = doc_lp
        self.memory = memory
        self.sources = 1 if doc_lp is None else int(doc_lp.shape[0])
        self.docs = self.sources - (memory is not None)  # passage rows per beam in `state`

    def expand(self, beams: int) -> None:
        if beams > 1:
            rows = torch.arange(self.state.rows).view(self.groups, 1, self.docs).expand(-1, beams, -1).reshape(-1)
            self.state = self.generator.select(self.state, rows)
            if self.memory is not None:
                self.memory.select(torch.arange(self.groups).repeat_interleave(beams))

    def row_logprobs(self) -> torch.Tensor:
        """(G * B, S, V) each source's log-probs of the next token (S = 1 without doc_lp)."""
        lp = self.state.logprobs
        lp = lp.view(-1, self.docs, lp.shape[-1])
        if self.memory is not None:
            lp = torch.cat([lp, self.memory.logprobs.to(lp.device)[:, None]], dim=1)
        return lp

    def logprobs(self, beams: int) -> torch.Tensor:
        """(G, B, V) log-probs of the next token."""
        lp = self.row_logprobs()
        if self.doc_lp is not None:
            lp = next_token_marginal(lp, self.doc_lp.to(lp.device).expand(lp.shape[0], -1))
        return lp.view(self.groups, beams, -1)

    def advance(self, source_beams: torch.Tensor, tokens: torch.Tensor) -> None:
        """source_beams, tokens: (G, B'); row (g, b) continues beam source_beams[g, b] with tokens[g, b]."""
        groups, beams = source_beams.shape
        beam_rows = (torch.arange(groups)[:, None] * source_beams.new_tensor(self.state.rows // groups // self.docs) + source_beams)
        rows = (beam_rows.reshape(-1, 1) * self.docs + torch.arange(self.docs)).reshape(-1)
        if not torch.equal(rows, torch.arange(self.state.rows)):
            self.state = self.generator.select(self.state, rows)
        self.state = self.generator.advance(self.state, tokens.reshape(-1).repeat_interleave(self.docs))
        if self.memory is not None:
            self.memory.select(beam_rows.reshape(-1))
            self.memory.advance(tokens.reshape(-1))


def _processed(processors, sequences: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """Apply processors to (N, V) log-probs given (N, L) sequences so far."""
    return processors(sequences, logprobs) if len(processors) else logprobs


def greedy(
    generator: Generator,
    state: DecodeState,
    *,
    groups: int,
    doc_lp: torch.Tensor | None,
    prefix: tuple[int, ...],
    max_new_tokens: int,
    stop_ids: frozenset[int],
    generation_config=None,
    copy_from: list[list[int]] | None = None,
    memory: MemoryRows | None = None,
    barred_first: frozenset[int] = frozenset(),
) -> list[Hypothesis]:
    """Greedy decoding of G groups at once; one hypothesis per group. `copy_from`: see `CopySpans`.
    `memory`: the generator's memory as the last of doc_lp's sources (RAG-Token, G = 1).
    `barred_first`: tokens no answer may begin with."""
    search = _Search(generator, state, groups, doc_lp, memory)
    processors = logits_processors(generator, prefix_len=len(prefix), max_new_tokens=max_new_tokens, generation_config=generation_config,
                                   copy_from=copy_from, stop_ids=stop_ids, barred_first=barred_first)
    sequences = torch.tensor([list(prefix)] * groups, dtype=torch.long).view(groups, len(prefix))
    scores = torch.zeros(groups)
    done = torch.zeros(groups, dtype=torch.bool)
    stop = torch.tensor(sorted(stop_ids), dtype=torch.long)
    row_steps = []  # per step (G, S): each source's log-prob of its group's token
    for step in range(max_new_tokens):
        lp = _processed(processors, sequences, search.logprobs(1)[:, 0].cpu())  # (G, V)
        tokens = lp.argmax(-1)
        if step > 0:  # finished groups repeat their last token; it is cut off below
            tokens = torch.where(done, sequences[:, -1], tokens)
        rows_lp = search.row_logprobs()  # (G, S, V)
        row_steps.append(rows_lp.gather(2, tokens.view(groups, 1, 1).expand(-1, rows_lp.shape[1], 1).to(rows_lp.device))[..., 0].cpu())
        scores = scores + torch.where(done, torch.zeros(()), lp.gather(1, tokens[:, None]).squeeze(1))
        sequences = torch.cat([sequences, tokens[:, None]], dim=1)
        done = done | torch.isin(tokens, stop)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        search.advance(torch.zeros(groups, 1, dtype=torch.long), tokens[:, None])
    per_row = torch.stack(row_steps, dim=2).float()  # (G, S, steps)
    hypotheses = []
    for g in range(groups):
        ids = sequences[g, len(prefix) :].tolist()
        cut = next((i + 1 for i, t in enumerate(ids) if t in stop_ids), len(ids))
        hypotheses.append(Hypothesis(ids=tuple(ids[:cut]), score=float(scores[g]), group=g, row_logprobs=per_row[g, :, :cut]))
    return hypotheses


def beam_search(
    generator: Generator,
    state: DecodeState,
    *,
    groups: int,
    doc_lp: torch.Tensor | None,
    prefix: tuple[int, ...],
    max_new_tokens: int,
    stop_ids: frozenset[int],
    num_beams: int,
    length_penalty: float | None = None,
    generation_config=None,
    copy_from: list[list[int]] | None = None,
    memory: MemoryRows | None = None,
    barred_first: frozenset[int] = frozenset(),
) -> list[list[Hypothesis]]:
    """Beam search for G groups at once; returns each group's finished hypotheses, best first.
    `copy_from`: see `CopySpans`; `memory`, `barred_first`: as for `greedy`."""
    if length_penalty is None:
        length_penalty = float((generation_config or generator.model.generation_config).length_penalty or 1.0)
    B, G = num_beams, groups
    search = _Search(generator, state, groups, doc_lp, memory)
    search.expand(B)
    processors = logits_processors(generator, prefix_len=len(prefix), max_new_tokens=max_new_tokens, generation_config=generation_config,
                                   copy_from=copy_from, stop_ids=stop_ids, barred_first=barred_first)
    stop = torch.tensor(sorted(stop_ids), dtype=torch.long)
    keep = max(2, 1 + len(stop_ids)) * B

    running = torch.tensor([list(prefix)] * (G * B), dtype=torch.long).view(G, B, len(prefix))
    running_scores = torch.zeros(G, B)
    running_scores[:, 1:] = NEG
    finished: list[list[tuple[float, tuple[int, ...]]]] = [[] for _ in range(G)]
    open_groups = [True] * G

    for step in range(max_new_tokens):
        length = step + 1  # generated tokens once this step's token is appended
        lp = search.logprobs(B).cpu()  # (G, B, V)
        vocab = lp.shape[-1]
        lp = _processed(processors, running.view(G * B, -1), lp.view(G * B, vocab)).view(G, B, vocab)
        total = (lp + running_scores[:, :, None]).view(G, B * vocab)
        top_scores, top_index = total.topk(min(keep, B * vocab), dim=1)  # (G, keep)
        source, tokens = top_index // vocab, top_index % vocab
        hits_stop = torch.isin(tokens, stop) | (length == max_new_tokens)
        for g in range(G):
            if not open_groups[g]:
                continue
            for rank in range(min(B, top_scores.shape[1])):  # only the top-B ranks may finish
                if hits_stop[g, rank]:
                    seq = tuple(running[g, source[g, rank], len(prefix) :].tolist()) + (int(tokens[g, rank]),)
                    finished[g].append((float(top_scores[g, rank]) / length**length_penalty, seq))
            finished[g] = sorted(finished[g], key=lambda item: -item[0])[:B]
        # the best B continuations that did not stop keep running
        masked = top_scores + hits_stop.float() * NEG
        next_scores, order = masked.topk(B, dim=1)  # (G, B)
        next_source = source.gather(1, order)
        next_tokens = tokens.gather(1, order)
        running = torch.cat([running.gather(1, next_source[:, :, None].expand(-1, -1, running.shape[2])), next_tokens[:, :, None]], 2)
        running_scores = next_scores
        for g in range(G):
            if open_groups[g] and len(finished[g]) == B:
                best_possible = float(running_scores[g, 0]) / length**length_penalty
                if best_possible <= finished[g][-1][0]:
                    open_groups[g] = False
        if not any(open_groups) or bool(hits_stop.all()) or length == max_new_tokens:
            break
        search.advance(next_source, next_tokens)
    return [[Hypothesis(ids=seq, score=score, group=g) for score, seq in finished[g]] for g in range(G)]


def reached_length_limit(ids: Sequence[int], max_new_tokens: int, stop_ids: frozenset[int]) -> bool:
    """Whether generated `ids` ran to `max_new_tokens` without a stop token: cut short, not ended.

    >>> reached_length_limit((5, 6, 7), 3, frozenset({2})), reached_length_limit((5, 2), 3, frozenset({2}))
    (True, False)
    """
    return len(ids) >= max_new_tokens and ids[-1] not in stop_ids


def length_limit_notice(answers: dict[str, Sequence[int]], max_new_tokens: int, stop_ids: frozenset[int]) -> tuple[str, ...]:
    """The notice for those of `answers` (name -> generated ids) that reached `max_new_tokens` before a stop token:
    cut short, not ended; () when every answer ended.

    >>> length_limit_notice({"RAG-Token": (5, 6, 2), "RAG-Sequence": (5, 2)}, 3, frozenset({2}))
    ()
    >>> length_limit_notice({"RAG-Token": (5, 6, 7), "RAG-Sequence": (5, 2)}, 3, frozenset({2}))
    ('RAG-Token reached the length limit of 3 tokens before ending: it is cut short',)
    """
    cut = [name for name, ids in answers.items() if reached_length_limit(ids, max_new_tokens, stop_ids)]
    if not cut:
        return ()
    return (f"{listed(cut)} reached the length limit of {max_new_tokens} tokens before ending: "
            f"{'it is' if len(cut) == 1 else 'they are'} cut short",)


def ending_notices(answers: dict[str, Sequence[int]], max_new_tokens: int, stop_ids: frozenset[int], *,
                   decode: Callable[[list[int]], str]) -> tuple[str, ...]:
    """What the reader should know of how `answers` (name -> generated ids) ended: those cut short at the length
    limit (`length_limit_notice`), and those the generator ended before writing a word (its first token was the
    stop; the page would show an empty answer with nothing said).

    >>> decode = lambda ids: "".join({5: "Paris", 2: "\\n"}[i] for i in ids)
    >>> ending_notices({"RAG-Token": (5, 2), "RAG-Sequence": (2,)}, 8, frozenset({2}), decode=decode)
    ('No words from RAG-Sequence: the generator ended the answer at once',)
    """
    empty = [name for name, ids in answers.items() if not decode(list(ids)).strip()]
    said = length_limit_notice(answers, max_new_tokens, stop_ids)
    if not empty:
        return said
    return (*said, f"No words from {listed(empty)}: the generator ended {'the answer' if len(empty) == 1 else 'each'} at once")
