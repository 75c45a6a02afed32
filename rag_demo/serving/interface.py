"""What the page and the command line may call on an engine, declared once.

`Engine` is the declaration. `rag_demo.engine.RagEngine` implements it; `BackgroundEngine` (a
build in a thread) and `EngineProcess` (the same in a child process) forward it, their methods
made from it by `forwarding`. A forwarded call is checked against the declaration where it is made
(`check_call`), so a misspelt or unknown keyword is refused at once in the caller's process with a
message that lists what the call takes, never a TypeError from a thread or a pickle from a pipe.

Defaults are the config's (`config.ASK`); None leaves the choice to the engine's own config
(`EngineConfig.decoding`, `.memory`, the retriever it offers first).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..config import ASK, VARIANTS
from ..errors import InputError, RagDemoError

if TYPE_CHECKING:
    from ..progress import Progress
    from ..results import AskResult, IndexReport, RetrieverComparison
    from ..retrieval.corpus import KnowledgeBase, Passage
    from .retriever_training import TrainingView


class Engine(Protocol):
    """The calls and fields the page and the command line use (RagEngine's documents each)."""

    @property
    def kb_names(self) -> tuple[str, ...]: ...

    @property
    def default_kb(self) -> str: ...

    @property
    def lexical_weight(self) -> float: ...  # BM25's weight for hybrid retrieval; 0: no hybrid

    @property
    def retrievers(self) -> tuple[str, ...]: ...  # those it offers: dense and bm25, and hybrid with a lexical weight

    def ask(self, question: str, *, kb: str | KnowledgeBase | None = None, k: int = ASK.k, index: str = ASK.index,
            variants: str | Sequence[str] = VARIANTS, num_beams: int | None = None, sequence_decoding: str | None = None,
            max_new_tokens: int | None = None, closed_book: bool = True, retriever: str | None = None,
            extractive: bool | None = None, memory: bool | None = None,
            progress: Progress | None = None) -> AskResult: ...

    def score(self, question: str, answer: str, *, kb: str | KnowledgeBase | None = None, k: int = ASK.k,
              index: str = ASK.index, variants: str | Sequence[str] = VARIANTS, retriever: str | None = None,
              memory: bool | None = None, progress: Progress | None = None) -> AskResult: ...

    def compare_retrievers(self, question: str, *, kb: str | KnowledgeBase | None = None,
                           k: int = ASK.k) -> RetrieverComparison: ...

    def index_reports(self, kb: str | KnowledgeBase | None = None, *, k: int = ASK.index_report_k) -> list[IndexReport]: ...

    def build_kb(self, name: str, passages: list[Passage], *, progress: Progress | None = None) -> KnowledgeBase: ...

    def example_questions(self, kb: str | None = None, n: int = ASK.examples) -> list[str]: ...

    # the logit of the generator's memory as a source for asks with this retriever; None: memory is no source
    def memory_logit(self, retriever: str | None = None, kb: str | None = None) -> float | None: ...

    def release_kb(self, kb: KnowledgeBase) -> None: ...


class Trainer(Protocol):
    """Visitors' runs training the question encoder on the page (`retriever_training.TrainingRuns`): held by
    the background engine beside the engine it serves, forwarded by the engine process."""

    def train_kbs(self) -> tuple[str, ...]: ...

    def train_begin(self, session: str, *, objective: str, questions: int, kb: str | None = None,
                    progress: Progress | None = None) -> TrainingView: ...

    def train_advance(self, session: str, *, steps: int, progress: Progress | None = None) -> TrainingView: ...

    def train_end(self, session: str) -> None: ...

    # the visitor pressed Stop: the session's reading or steps end at the next question read or step, not after
    # a whole widening (a minute of reading on two cores); its run, and the steps taken, stay
    def train_stop(self, session: str) -> None: ...

    # `Engine.ask` and `.score` with the question encoder the session's run trained, for that call only; the
    # result's `question_encoder` names it. No trained encoder: `NoTrainedEncoder`
    def train_ask(self, session: str, question: str, *, kb: str | KnowledgeBase | None = None, k: int = ASK.k,
                  index: str = ASK.index, variants: str | Sequence[str] = VARIANTS, num_beams: int | None = None,
                  sequence_decoding: str | None = None, max_new_tokens: int | None = None, closed_book: bool = True,
                  retriever: str | None = None, extractive: bool | None = None, memory: bool | None = None,
                  progress: Progress | None = None) -> AskResult: ...

    def train_score(self, session: str, question: str, answer: str, *, kb: str | KnowledgeBase | None = None,
                    k: int = ASK.k, index: str = ASK.index, variants: str | Sequence[str] = VARIANTS,
                    retriever: str | None = None, memory: bool | None = None,
                    progress: Progress | None = None) -> AskResult: ...


def _declared(protocol: type) -> tuple[tuple[str, ...], dict[str, inspect.Signature]]:
    fields, calls = [], {}
    for name, member in vars(protocol).items():
        if isinstance(member, property):
            fields.append(name)
        elif inspect.isfunction(member) and not name.startswith("_"):
            calls[name] = inspect.signature(member)
    return tuple(fields), calls


ENGINE_FIELDS, _ENGINE_SIGNATURES = _declared(Engine)
ENGINE_CALLS = tuple(_ENGINE_SIGNATURES)
TRAINING_CALLS = tuple(_declared(Trainer)[1])
_SIGNATURES = {**_ENGINE_SIGNATURES, **_declared(Trainer)[1]}
_DECLARED_IN = {**{name: Engine for name in ENGINE_CALLS}, **{name: Trainer for name in TRAINING_CALLS}}
# Calls that read what the engine holds: quick, so a build running beside them need not step aside.
READING_CALLS = frozenset({"example_questions", "memory_logit", "release_kb", "train_kbs", "train_end", "train_stop"})


def call_signature(name: str) -> inspect.Signature:
    """The declared signature of an engine call, `self` included."""
    return _SIGNATURES[name]


def check_call(name: str, args: tuple, kwargs: dict) -> None:
    """Raise InputError unless `engine.name(*args, **kwargs)` fits the declaration.

    >>> check_call("example_questions", ("wikipedia",), {"n": 3})
    >>> check_call("ask", ("who wrote hamlet?",), {"kk": 3})
    Traceback (most recent call last):
    ...
    rag_demo.errors.InputError: engine.ask() got an unexpected keyword argument 'kk'; it takes question, kb, k, \
index, variants, num_beams, sequence_decoding, max_new_tokens, closed_book, retriever, extractive, memory, progress
    """
    signature = _SIGNATURES.get(name)
    if signature is None:
        raise InputError(f"the engine has no call {name!r}; it offers {', '.join(_SIGNATURES)}")
    try:
        signature.bind(None, *args, **kwargs)
    except TypeError as err:
        takes = ", ".join(p for p in signature.parameters if p != "self")
        raise InputError(f"engine.{name}() {_without_name(str(err))}; it takes {takes}") from None


def _without_name(message: str) -> str:
    """bind's TypeError names no function ("got an unexpected keyword argument 'kk'"); keep it that way."""
    return message.split("() ", 1)[-1] if "() " in message else message


Forwarder = TypeVar("Forwarder", bound=type)


def forwarding(cls: Forwarder) -> Forwarder:
    """Class decorator: each declared call (the engine's and the training runs') becomes a method that
    checks its arguments (`check_call`) and then runs `self._forward(name, args, kwargs)`; each declared
    field a property that reads `self._field(name)`. The methods carry the declaration's signature, so
    help() and the API see it."""
    for name in _SIGNATURES:
        setattr(cls, name, _forwarder(name))
    for name in ENGINE_FIELDS:
        setattr(cls, name, property(functools.partial(_read_field, name=name), doc=f"The serving engine's {name}."))
    return cls


def _read_field(self: Any, *, name: str) -> Any:
    return self._field(name)


def _forwarder(name: str) -> Callable[..., Any]:
    declared = getattr(_DECLARED_IN[name], name)

    @functools.wraps(declared)
    def forwarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        check_call(name, args, kwargs)
        return self._forward(name, args, kwargs)

    forwarded.__signature__ = _SIGNATURES[name]
    return forwarded


class EngineNotReady(RagDemoError):
    """The engine is still being prepared (first start) or failed to start."""


class NoTrainedEncoder(InputError):
    """A visitor asked with the question encoder their Train run trained, and no run of theirs holds one (none was
    trained, or the run ended: a new run, or the session's end)."""


def not_ready(status_text: str, *, failed: bool) -> EngineNotReady:
    """What a call meets before any engine serves: the build's status and what to do."""
    return EngineNotReady(status_text + (" Restart the app once fixed." if failed else " Try again in a moment."))


@dataclass(frozen=True)
class BuildStatus:
    """The build as data, for the API (`/status_json`): what serves, what is building, how far it has come."""

    status: str  # the banner's text
    seconds: float  # since the build started
    ready: bool = False  # an engine serves
    complete: bool = False  # and nothing is being built any more
    engines_served: int = 0  # 1 + the swaps so far
    serving: str = ""  # which parts answer
    building: str = ""  # what is still being built
    step: str = ""  # the build's current step, with `done` of `total`
    done: int = 0
    total: int = 0
    error: str = ""  # why the build stopped, if it did

    def to_json(self) -> dict:
        return asdict(self)


def engine_ready(engine: Engine) -> bool:
    """Plain engines are always ready; a `BackgroundEngine` says so itself."""
    return bool(getattr(engine, "ready", True))


def engine_complete(engine: Engine) -> bool:
    """Plain engines are complete; a `BackgroundEngine` is once nothing is being built any more."""
    return bool(getattr(engine, "complete", True))


def engines_served(engine: Engine) -> int:
    """How many engines have served so far: 1 for a plain engine; a `BackgroundEngine` counts its swaps."""
    return int(getattr(engine, "engines_served", 1))
