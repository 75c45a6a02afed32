"""Teacher forcing: log p(y_t | x, z, y<t) of given answers under each source, for provenance and scoring.

The rows of a `DecodeState` are the passages as the generator read them. Where the generator's memory
is a source, it is row `state.rows` (one past the passages): the answer read after the closed-book
prompt (`closed_state`'s row 0), with the base weights. Decoding scores some (answer, source) pairs as
it goes; the rest come from here in as few forward passes as the memory bound allows
(`Generator.continuation_logprobs`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .decode_state import DecodeState
    from .generator import Generator


def rows_logprobs(generator: Generator, state: DecodeState, targets: list[tuple[int, ...]],
                  rows_per_target: list[list[int]]) -> list[torch.Tensor]:
    """For each target, (len(rows), T) log p(y_t|x,z,y<t) under its rows of `state`, in one pass.

    targets: T_i ids each; rows_per_target: the rows of `state` to score target i under."""
    pairs = [(t, r) for t, rows in enumerate(rows_per_target) for r in rows]
    if not pairs:
        return [torch.zeros(0, len(t)) for t in targets]
    length = max(len(targets[t]) for t, _ in pairs)
    ids = torch.full((len(pairs), max(length, 1)), 0, dtype=torch.long)
    mask = torch.zeros(len(pairs), max(length, 1), dtype=torch.bool)
    for i, (t, _) in enumerate(pairs):
        ids[i, : len(targets[t])] = torch.tensor(targets[t], dtype=torch.long)
        mask[i, : len(targets[t])] = True
    rows = torch.tensor([r for _, r in pairs])
    logprobs = generator.continuation_logprobs(state, rows, ids, mask)  # (P, T)
    out, cursor = [], 0
    for t, rows in enumerate(rows_per_target):
        out.append(logprobs[cursor : cursor + len(rows), : len(targets[t])])
        cursor += len(rows)
    return out


def sources_logprobs(generator: Generator, state: DecodeState, closed_state: DecodeState | None,
                     targets: list[tuple[int, ...]], rows_per_target: list[list[int]]) -> list[torch.Tensor]:
    """As `rows_logprobs`, where row `state.rows` stands for the memory (`closed_state`, base weights)."""
    memory = state.rows
    passages = rows_logprobs(generator, state, targets, [[r for r in rows if r != memory] for rows in rows_per_target])
    wants = [memory in rows for rows in rows_per_target]
    if not any(wants):
        return passages
    with generator.base_weights():
        recalled = rows_logprobs(generator, closed_state, targets, [[0] if w else [] for w in wants])
    out = []
    for rows, lps, mem in zip(rows_per_target, passages, recalled):
        got = dict(zip([r for r in rows if r != memory], lps)) | dict(zip([memory] if memory in rows else [], mem))
        out.append(torch.stack([got[r] for r in rows]) if rows else lps)
    return out


def every_source_logprobs(generator: Generator, state: DecodeState, closed_state: DecodeState | None, sources: int,
                          targets: list[tuple[int, ...]], known: list[dict[int, torch.Tensor]]) -> list[torch.Tensor]:
    """(S, T) log p(y_t|x,z,y<t) of each target under each of the `sources` (the passages' rows, then the
    memory's when sources = rows + 1): those decoding already scored (`known[i][row]`, (T,)) are reused,
    the rest teacher-forced."""
    missing = [[r for r in range(sources) if r not in have] for have in known]
    forced = sources_logprobs(generator, state, closed_state, targets, missing)
    out = []
    for target, have, rows, lps in zip(targets, known, missing, forced):
        got = dict(have) | {r: lps[i] for i, r in enumerate(rows)}
        out.append(torch.stack([got[r] for r in range(sources)]) if got else torch.zeros(0, len(target)))
    return out
