"""Progress reports for long first-run work: `progress(stage, done, total)`."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Protocol


class Progress(Protocol):
    def __call__(self, stage: str, done: int, total: int) -> None: ...


class StepCounter:
    """Counts one task's steps for `progress(stage, done, total)`, each call a step begun; without a listener it
    does nothing. `done` stays under `total`: the task is not over while its last step runs."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, stage: str) -> None:
        if self.progress is not None:
            self.progress(stage, min(self.done, self.total - 1), self.total)
        self.done += 1


def counted(n: int, noun: str) -> str:
    """A count with its noun, plural when needed (progress steps and page messages).

    >>> counted(1, "passage"), counted(2_000, "passage")
    ('1 passage', '2,000 passages')
    """
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def listed(items: Sequence[str]) -> str:
    """Items as a sentence lists them (page and command-line messages).

    >>> listed(["#2"]), listed(["#1", "#3"]), listed(["RAG-Token", "RAG-Sequence", "the closed-book answer"])
    ('#2', '#1 and #3', 'RAG-Token, RAG-Sequence and the closed-book answer')
    """
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def eta_text(done: int, total: int, elapsed: float) -> str:
    """'3m 10s left' from the rate so far; '' until there is a rate.

    >>> eta_text(50, 100, 30.0)
    '30s left'
    """
    if done <= 0 or total <= done or elapsed <= 0:
        return ""
    left = elapsed * (total - done) / done
    minutes, seconds = divmod(int(round(left)), 60)
    return f"{minutes}m {seconds:02d}s left" if minutes else f"{seconds}s left"


class ConsoleProgress:
    """A one-line bar on stderr with rate and time left, redrawn at most every 0.2 s."""

    def __init__(self, stream=None, *, min_interval: float = 0.2):
        self.stream = stream or sys.stderr
        self.min_interval = min_interval
        self.stage = None
        self.started = 0.0
        self.last_draw = 0.0

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if stage != self.stage:
            if self.stage is not None:
                self.stream.write("\n")
            self.stage, self.started, self.last_draw = stage, now, 0.0
        finished = total > 0 and done >= total
        if not finished and now - self.last_draw < self.min_interval:
            return
        self.last_draw = now
        fraction = done / total if total > 0 else 0.0
        bar = "#" * int(fraction * 30)
        self.stream.write(f"\r{stage}: [{bar:<30}] {done}/{total} {eta_text(done, total, now - self.started)}   ")
        if finished:
            self.stream.write("\n")
            self.stage = None
        self.stream.flush()
