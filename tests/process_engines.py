"""Engines for the engine-process tests, built in the child from factories that pickle.

`FakeEngine` answers instantly and misbehaves on cue (the question says how), so the pipe's
handling of progress, errors and a dying child is checked without loading a model.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from rag_demo.serving.background import Stage
from rag_demo.errors import InputError


class TwoArgumentError(Exception):
    """An exception that does not survive pickling (its __init__ needs two arguments)."""

    def __init__(self, what: str, why: str):
        super().__init__(f"{what}: {why}")


@dataclass(frozen=True)
class FakeAnswer:
    question: str
    kb: str
    k: int
    engine: str
    pid: int
    notices: tuple[str, ...] = ()
    memory: bool | None = None  # the memory switch, as the call gave it


class FakeEngine:
    kb_names = ("left", "right")
    default_kb = "left"
    lexical_weight = 0.0
    retrievers = ("dense", "bm25")

    def __init__(self, label: str = "fake"):
        self.label = label

    def ask(self, question: str, *, kb="left", k: int = 5, memory: bool | None = None, progress=None, **options):
        if question == "die":
            os._exit(3)
        if question == "":
            raise InputError("type a question first")
        if question == "unpicklable error":
            raise TwoArgumentError("kaboom", "it broke")
        if question == "slow":
            time.sleep(0.5)
        for step in range(3):
            if progress is not None:
                progress("reading", step + 1, 3)
        kb_name = kb if isinstance(kb, str) else f"own:{kb['name']}"
        return FakeAnswer(question, kb_name, k, self.label, os.getpid(), memory=memory)

    def memory_logit(self, retriever: str | None = None, kb: str | None = None) -> float | None:
        return {"dense": 1.5}.get(retriever or "dense")

    def build_kb(self, name: str, passages: list, *, progress=None):
        if name == "unpicklable":
            return lambda: None
        if progress is not None:
            progress("embedding", len(passages), len(passages))
        return {"name": name, "passages": list(passages)}

    def example_questions(self, kb: str, n: int = 8) -> list[str]:
        return [f"{kb} question {i}" for i in range(n)]

    def release_kb(self, kb) -> None:
        self.released = kb


def fake_engine(progress):
    progress("loading", 1, 1)
    return FakeEngine()


def staged_fake_engines(progress, *, hold_s: float = 0.0):
    """A first engine that serves while a second is "built"; the second is complete."""
    yield Stage(FakeEngine("first"), serving="the first part", building="the second part is building")
    time.sleep(hold_s)
    yield Stage(FakeEngine("second"), serving="everything")


def failing_factory(progress):
    raise InputError("the cache folder is not writable")


def tiny_rag_engine(progress, *, folder: str, memory_logit: float | None = None):
    """tests/ui_engine.py's engine; with `memory_logit`, the generator's memory is a source at that logit."""
    from dataclasses import replace

    from rag_demo.config import MemoryConfig
    from tests.ui_engine import make_ui_engine

    engine = make_ui_engine(Path(folder))
    if memory_logit is not None:
        engine.config = replace(engine.config, memory=MemoryConfig(logit=memory_logit))
    return engine


def tiny_rag_engine_with_training_questions(progress, *, folder: str, pairs: tuple):
    """`tiny_rag_engine`, whose first knowledge base the page's Train tab trains on `pairs` (training, held out)."""
    from rag_demo.serving import retriever_training
    from tests.ui_engine import KB_NAMES

    retriever_training.QUESTION_SETS_FOR_KB = {KB_NAMES[0]: pairs}  # this child's own module: nothing else reads it
    return tiny_rag_engine(progress, folder=folder)
