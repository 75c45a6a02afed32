"""One method per page event: parse the inputs, make one engine call, format, return.

Each event's outputs are a named tuple (rag_demo.ui.views), so a value can only land in the
component of its name: leaving an output out, or naming one the view lacks, is a TypeError instead
of a silent shift of every output after it. An error becomes a message in the event's status box
and leaves the other outputs as they were (`changed`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import gradio as gr

from .. import plots
from ..serving.interface import Engine, NoTrainedEncoder, engine_complete, engine_ready, engines_served
from ..config import ASK, DECODING_DEFAULTS, INDEX_KINDS, RETRIEVER_NAMES, SWAP_PAIRS, VARIANTS
from ..retrieval.corpus import KnowledgeBase, Passage
from ..errors import InputError, RagDemoError
from ..options import parse_variants
from ..progress import counted
from ..results import AskResult
from ..text import plain_text
from .html import (
    format_answer_html,
    format_kb_preview,
    format_score_html,
    format_status,
    format_swap_summary,
    memory_switch_info,
    passage_choices,
)
from .passage_cards import format_comparison_html, format_result_passages, format_swap_column
from .index_table import format_index_table
from .exports import write_exports
from .inputs import (
    TRAINED,
    PageLink,
    SessionFiles,
    UploadLimits,
    link_query,
    memory_switch,
    parse_beams,
    parse_extractive,
    parse_k,
    parse_link,
    parse_memory,
    parse_question_encoder,
    parse_retriever,
    passages_from_inputs,
    require_answer,
    require_question,
)
from .learn import format_learn_html, learn_token_choices
from .outcomes import api_json, failure_status, noted_memory, part_of, plot_update, progress_reporter
from .sentences import as_sentence
from .train import encoder_gone, training_runs
from .views import (
    AskView,
    CompareView,
    ExportView,
    Held,
    IndexView,
    LearnView,
    LinkView,
    MineAnswerView,
    MineView,
    PassageView,
    PollView,
    ScoreView,
    SwapView,
    changed,
    unwrap,
)

log = logging.getLogger(__name__)

PRIVATE_KB = "__mine__"  # the dropdown value that means "this visitor's own knowledge base"
PRIVATE_LABEL = "my knowledge (this session)"
PRIVATE_NAME = "my knowledge"  # as the dropdown calls it
KB_MENUS = ("kb", "swap_left", "swap_right", "score_kb", "idx_kb")  # the knowledge-base dropdowns of every tab
# A link opened while the engine starts waits this long for it, so that a shared link answers once the first engine
# serves (a warm start: seconds; a first start's BM25 stage: under a minute) instead of saying "try again"
LINK_WAIT_S = 120.0


class EncoderCalls(NamedTuple):
    """The engine's `ask` and `score`, or both with the question encoder this visitor's Train run trained: what the
    Ask, Score and Swap tabs call, by their question-encoder choice (`DemoActions.encoder_calls`)."""

    ask: Callable[..., AskResult]
    score: Callable[..., AskResult]
    trained: bool  # with the trained encoder: its memory notice says why ∅ is no source (`noted_memory`)


class DemoActions:
    """One method per page event. Each parses its inputs, makes one engine call and formats the result.

    `runs` are the visitors' Train runs (`train.training_runs(engine)` unless given), whose trained encoders the
    Ask, Score and Swap tabs ask with; the Train tab must train the same runs."""

    def __init__(self, engine: Engine, *, limits: UploadLimits = UploadLimits(), files: SessionFiles | None = None,
                 runs=None):
        self.engine = engine
        self.limits = limits
        self.files = files or SessionFiles()
        self.runs = runs if runs is not None else training_runs(engine)

    # ---- helpers -----------------------------------------------------------------------------
    def kb_names(self) -> tuple[str, ...]:
        return tuple(self.engine.kb_names) if engine_ready(self.engine) else ()

    def default_kb(self) -> str | None:
        return self.engine.default_kb if engine_ready(self.engine) else None

    def swap_pair(self) -> tuple[str | None, str | None]:
        """The Swap tab's two knowledge bases: the first real / counterfactual pair the engine holds
        (`config.SWAP_PAIRS`), else the default and the next."""
        names = self.kb_names()
        pair = next((pair for pair in SWAP_PAIRS if set(pair) <= set(names)), None)
        if pair is not None:
            return pair
        default = self.default_kb()
        return default, next((n for n in names if n != default), default)

    def swap_examples(self) -> list[list[str]]:
        """The counterfactual side's example questions (their answers were swapped), else the left's."""
        left, right = self.swap_pair()
        return self.examples(right) or self.examples(left)

    def kb_choices(self, mine: Held | KnowledgeBase | None) -> list[tuple[str, str]]:
        choices = [(name, name) for name in self.kb_names()]
        mine = unwrap(mine)
        if mine is not None:
            choices.append((f"{PRIVATE_LABEL}: {counted(len(mine), 'passage')}", PRIVATE_KB))
        return choices

    def resolve_kb(self, choice: str | None, mine: Held | KnowledgeBase | None) -> str | KnowledgeBase:
        mine = unwrap(mine)
        if choice == PRIVATE_KB:
            if mine is None:
                raise InputError("Build your knowledge base first in the 'Your knowledge' tab.")
            return mine
        if not choice:
            return self.engine.default_kb
        return self.known_kb(choice)

    def known_kb(self, name: str) -> str:
        """A knowledge base named by a visitor must be one the page offers: never a folder on the server."""
        names = tuple(self.engine.kb_names)  # while the engine starts, this says so (EngineNotReady)
        if not isinstance(name, str) or name not in names:
            raise InputError(f"unknown knowledge base {str(name)[:80]!r}; choose one of {', '.join(names)}")
        return name

    @staticmethod
    def fit_k(k: object, kb: str | KnowledgeBase) -> int:
        """k from the slider, lowered to the size of a visitor's own (small) knowledge base."""
        value = parse_k(k)
        return min(value, len(kb)) if isinstance(kb, KnowledgeBase) else value

    def examples(self, kb_choice: str | None) -> list[list[str]]:
        if not engine_ready(self.engine) or kb_choice == PRIVATE_KB:
            return []
        try:
            return [[q] for q in self.engine.example_questions(kb_choice or self.engine.default_kb, 8)]
        except RagDemoError as err:
            log.warning("no example questions: %s", err)
            return []

    def examples_update(self, kb_choice: str | None) -> gr.Dataset:
        """New example questions when the knowledge base changes; none for a visitor's own (the
        examples ask about the NQ passages, which it does not hold)."""
        samples = [] if kb_choice == PRIVATE_KB else self.examples(kb_choice)
        return gr.Dataset(samples=samples, visible=bool(samples))

    def encoder_calls(self, question_encoder: str | None, request: gr.Request | None) -> EncoderCalls:
        """The engine's calls for a tab's question-encoder choice: its own, or with `TRAINED` those with the encoder
        this visitor's Train run trained (they raise `NoTrainedEncoder` when it has none; see `train.encoder_gone`)."""
        if parse_question_encoder(question_encoder) != TRAINED:
            return EncoderCalls(ask=self.engine.ask, score=self.engine.score, trained=False)
        session = getattr(request, "session_hash", None) or ""
        return EncoderCalls(ask=functools.partial(self.runs.train_ask, session),
                            score=functools.partial(self.runs.train_score, session), trained=True)

    # ---- Ask ----------------------------------------------------------------------------------

    def ask(self, question: str, variant: str, k: float, index: str, kb_choice: str | None, num_beams: float,
            sequence_decoding: str, mine: Held | KnowledgeBase | None, retriever: str | None = None,
            extractive: bool = False, memory: bool = True, question_encoder: str | None = None,
            request: gr.Request | None = None,
            progress: gr.Progress = gr.Progress(),  # noqa: B008 (gradio injects a tracker here)
            ) -> AskView:
        try:
            knowledge = self.resolve_kb(kb_choice, mine)
            wanted = memory_switch(memory)
            calls = self.encoder_calls(question_encoder, request)
            result = calls.ask(
                require_question(question),
                kb=knowledge,
                k=self.fit_k(k, knowledge),
                index=index or ASK.index,
                variants=parse_variants(variant),
                num_beams=parse_beams(num_beams),
                sequence_decoding=sequence_decoding or DECODING_DEFAULTS.sequence_decoding,
                closed_book=True,
                retriever=parse_retriever(retriever),
                extractive=bool(extractive),
                memory=wanted,
                progress=progress_reporter(progress),
            )
        except NoTrainedEncoder:  # the run ended (a new one, or the page's state expired): back to the packaged encoder
            return encoder_gone(AskView)
        except Exception as err:  # the UI boundary: a message in the page, never a traceback
            return changed(AskView, status=failure_status(err))
        result = noted_memory(result, wanted, trained=calls.trained)
        heat = {name: plots.posterior_heatmap(v, result.passages) for name, v in result.variants.items()}
        words = {name: plots.describe_heatmap(v, result.passages) for name, v in result.variants.items()}
        variants = list(result.variants.values())
        return AskView(
            status="",
            answer=format_answer_html(result),
            passages=format_result_passages(result),
            doc_prob=plot_update(plots.doc_prob_figure(result), plots.describe_doc_prob(result)),
            heat_token=plot_update(heat.get("token"), words.get("token", "")),
            heat_seq=plot_update(heat.get("sequence"), words.get("sequence", "")),
            gain=plot_update(plots.retrieval_gain_figure(variants), plots.describe_gain(variants)),
            question_encoder=gr.skip(),
            last=Held(result),
        )

    def ask_json(self, question: str, variant: str = ASK.variant, k: int = ASK.k, index: str = ASK.index, kb: str = "",
                 retriever: str = "", extractive: bool = False, memory: bool | str | None = None) -> dict:
        """The API: the AskResult as JSON. Errors come back as a gradio error with the message.
        `memory` as `inputs.parse_memory` reads it: empty is on where available, true required, false off;
        `extractive` true or false, empty false; an empty `variant`, `index`, `kb` or `retriever` is the default."""
        return api_json("/ask_json", lambda: self.engine.ask(
            require_question(question, page=False), kb=self.known_kb(kb) if kb else self.engine.default_kb, k=parse_k(k),
            index=index or ASK.index, variants=parse_variants(variant or ASK.variant), retriever=parse_retriever(retriever),
            extractive=parse_extractive(extractive), memory=parse_memory(memory)))

    # ---- Compare retrievers ---------------------------------------------------------------------
    def compare(self, question: str, kb_choice: str | None, k: float, mine: Held | KnowledgeBase | None) -> CompareView:
        """The same question, KB and k under each retriever the engine offers."""
        try:
            knowledge = self.resolve_kb(kb_choice, mine)
            comparison = self.engine.compare_retrievers(require_question(question), kb=knowledge, k=self.fit_k(k, knowledge))
        except Exception as err:  # the UI boundary
            return changed(CompareView, status=failure_status(err))
        return CompareView(status="", comparison=format_comparison_html(comparison))

    def compare_json(self, question: str, kb: str = "", k: int = ASK.k) -> dict:
        """The API: the RetrieverComparison as JSON, each ranking with the share memory would take beside its k
        passages (`RetrieverComparison.to_json`). Errors come back as a gradio error with the message."""
        return api_json("/compare_json", lambda: self.engine.compare_retrievers(
            require_question(question, page=False), kb=self.known_kb(kb) if kb else self.engine.default_kb, k=parse_k(k),
        ).to_json(getattr(self.engine, "memory_logit", None)))  # a wrapper may not offer it

    # ---- Swap the index -----------------------------------------------------------------------
    def swap(self, question: str, left: str | None, right: str | None, variant: str, k: float,
             mine: Held | KnowledgeBase | None, memory: bool = True, question_encoder: str | None = None,
             request: gr.Request | None = None,
             progress: gr.Progress = gr.Progress(),  # noqa: B008 (gradio injects a tracker here)
             ) -> SwapView:
        """Same question and model, two knowledge bases. The closed-book answer is asked too, so that an
        answer memory gave against its passages shows as the knowledge conflict it is."""
        try:
            question = require_question(question)
            sides = [self.resolve_kb(left, mine), self.resolve_kb(right, mine)]
            wanted = memory_switch(memory)
            report = progress_reporter(progress)
            calls = self.encoder_calls(question_encoder, request)
            a, b = (noted_memory(calls.ask(
                        question, kb=kb, k=self.fit_k(k, kb), variants=parse_variants(variant), closed_book=True,
                        memory=wanted, progress=part_of(report, side, len(sides), getattr(kb, "name", kb))), wanted,
                        trained=calls.trained)
                    for side, kb in enumerate(sides))
        except NoTrainedEncoder:  # as for `ask`
            return encoder_gone(SwapView)
        except Exception as err:  # the UI boundary
            return changed(SwapView, status=failure_status(err))
        return SwapView(status="", summary=format_swap_summary(a, b), left=format_swap_column(a), right=format_swap_column(b),
                        question_encoder=gr.skip())

    # ---- Your knowledge -----------------------------------------------------------------------
    def build_mine(self, files: list[str] | None, paste_title: str, paste_text: str, mine: Held | KnowledgeBase | None,
                   progress: gr.Progress = gr.Progress(),  # noqa: B008 (gradio injects a tracker here)
                   request: gr.Request | None = None) -> MineView:
        started = time.perf_counter()
        try:
            if files and len(files) > self.limits.max_files:
                raise InputError(f"{len(files)} files uploaded; the limit is {self.limits.max_files}. Remove some and build again.")
            session = getattr(request, "session_hash", None)
            if files and session:
                files = self.files.adopt(session, files)
            passages = passages_from_inputs(files, paste_title, paste_text, limits=self.limits)
            kb = self.engine.build_kb(PRIVATE_NAME, passages, progress=progress_reporter(progress))
        except Exception as err:  # the UI boundary: the session keeps its previous knowledge base
            return changed(MineView, status=failure_status(err), mine=mine)
        sources = len(files or []) + (1 if (paste_text or "").strip() else 0)
        status = format_status(
            f"Indexed {counted(len(kb), 'passage')} from {counted(sources, 'source')} in "
            f"{time.perf_counter() - started:.1f} s. "
            f"Ask below, or pick “{PRIVATE_LABEL}” in the other tabs.", "ok")
        return self._mine_view(status, kb)

    def _mine_view(self, status: str, kb: KnowledgeBase) -> MineView:
        choices = self.kb_choices(kb)
        return MineView(status=status, mine=Held(kb), picker=gr.update(choices=passage_choices(kb), value=0),
                        edit_title=kb.titles[0], edit_text=kb.texts[0], preview=format_kb_preview(kb), ask_status="",
                        editor=gr.update(visible=True), **{menu: gr.update(choices=choices) for menu in KB_MENUS})

    def pick_passage(self, position: int | None, mine: Held | KnowledgeBase | None) -> PassageView:
        mine = unwrap(mine)
        if mine is None or position is None or not 0 <= int(position) < len(mine):
            return PassageView(title="", text="")
        return PassageView(title=mine.titles[int(position)], text=mine.texts[int(position)])

    def save_passage(self, position: int | None, title: str, text: str, mine: Held | KnowledgeBase | None,
                     progress: gr.Progress = gr.Progress()) -> MineView:  # noqa: B008 (gradio injects a tracker here)
        """Replace one passage (empty text removes it) and re-index."""
        kb_before = unwrap(mine)
        try:
            if kb_before is None:
                raise InputError("Build your knowledge base first, then pick a passage to edit.")
            if position is None or not 0 <= int(position) < len(kb_before):
                raise InputError("Pick a passage to edit.")
            passages = [kb_before.passage(i) for i in range(len(kb_before))]
            if (text or "").strip():
                passages[int(position)] = Passage(title=plain_text(title or "").strip(), text=" ".join(plain_text(text).split()))
                what = f"Saved passage {int(position) + 1}"
            else:
                del passages[int(position)]
                what = f"Removed passage {int(position) + 1}"
            kb = self.engine.build_kb(PRIVATE_NAME, passages, progress=progress_reporter(progress))
        except Exception as err:  # the UI boundary
            return changed(MineView, status=failure_status(err), mine=mine)
        return self._mine_view(format_status(f"{what} and re-indexed {counted(len(kb), 'passage')}. Ask again.", "ok"), kb)

    def ask_mine(self, question: str, mine: Held | KnowledgeBase | None,
                 progress: gr.Progress = gr.Progress(),  # noqa: B008 (gradio injects a tracker here)
                 ) -> MineAnswerView:
        """Both variants against the visitor's own knowledge base."""
        kb = unwrap(mine)
        try:
            if not isinstance(kb, KnowledgeBase):
                raise InputError("Build your knowledge base first (upload or paste text above).")
            result = self.engine.ask(require_question(question, examples=False), kb=kb, k=min(5, len(kb)),
                                     variants=VARIANTS, progress=progress_reporter(progress))
        except Exception as err:  # the UI boundary
            return changed(MineAnswerView, status=failure_status(err))
        result = noted_memory(result, None)
        return MineAnswerView(status="", answer=format_answer_html(result), passages=format_result_passages(result))

    # ---- Score your answer ----------------------------------------------------------------------
    def score(self, question: str, answer: str, kb_choice: str | None, k: float, index: str,
              mine: Held | KnowledgeBase | None, memory: bool = True, question_encoder: str | None = None,
              request: gr.Request | None = None,
              progress: gr.Progress = gr.Progress(),  # noqa: B008 (gradio injects a tracker here)
              ) -> ScoreView:
        try:
            if not any(isinstance(text, str) and text.strip() for text in (question, answer)):
                raise InputError("Type a question and the answer to score for it.")
            question, answer = require_question(question, examples=False), require_answer(answer)  # in the page's order
            knowledge = self.resolve_kb(kb_choice, mine)
            wanted = memory_switch(memory)
            calls = self.encoder_calls(question_encoder, request)
            result = calls.score(question, answer, kb=knowledge,
                                 k=self.fit_k(k, knowledge), index=index or ASK.index, variants=VARIANTS,
                                 memory=wanted, progress=progress_reporter(progress))
        except NoTrainedEncoder:  # as for `ask`
            return encoder_gone(ScoreView)
        except Exception as err:  # the UI boundary
            return changed(ScoreView, status=failure_status(err))
        result = noted_memory(result, wanted, trained=calls.trained)
        heat = {name: plots.posterior_heatmap(v, result.passages) for name, v in result.variants.items()}
        words = {name: plots.describe_heatmap(v, result.passages) for name, v in result.variants.items()}
        variants = list(result.variants.values())
        return ScoreView(status="", cards=format_score_html(result),
                         heat_token=plot_update(heat.get("token"), words.get("token", "")),
                         heat_seq=plot_update(heat.get("sequence"), words.get("sequence", "")),
                         gain=plot_update(plots.retrieval_gain_figure(variants), plots.describe_gain(variants)),
                         question_encoder=gr.skip())

    def score_json(self, question: str, answer: str, kb: str = "", k: int = ASK.k, index: str = ASK.index,
                   variant: str = ASK.variant, retriever: str = "", memory: bool | str | None = None) -> dict:
        """The API: log p(answer|question) with its provenance, the AskResult as JSON; `memory` as for `ask_json`."""
        return api_json("/score_json", lambda: self.engine.score(
            require_question(question, page=False), require_answer(answer, page=False), kb=self.known_kb(kb) if kb else self.engine.default_kb,
            k=parse_k(k), index=index or ASK.index, variants=parse_variants(variant or ASK.variant), retriever=parse_retriever(retriever),
            memory=parse_memory(memory)))

    # ---- Index variants -----------------------------------------------------------------------
    def index_reports(self, kb_choice: str | None, mine: Held | KnowledgeBase | None) -> IndexView:
        try:
            kb = self.resolve_kb(kb_choice, mine)
            started = time.perf_counter()
            reports = self.engine.index_reports(kb)
            elapsed = time.perf_counter() - started
        except Exception as err:  # the UI boundary
            return changed(IndexView, status=failure_status(err))
        name = kb.name if isinstance(kb, KnowledgeBase) else kb
        return IndexView(status="", table=format_index_table(reports, name, click_seconds=elapsed),
                         figure=plot_update(plots.index_report_figure(reports), plots.describe_index_reports(reports)))

    # ---- links and downloads --------------------------------------------------------------------
    def open_link(self, request: gr.Request | None = None) -> LinkView:
        """The page was opened: set what its link (`?q=`, `?kb=`, `?variant=`, `?tab=`, `?left=`, ...) asks for."""
        params = dict(getattr(request, "query_params", None) or {})
        retrievers = tuple(getattr(self.engine, "retrievers", ())) if engine_ready(self.engine) else ()
        link = parse_link(params, kb_names=self.kb_names() or None, index_kinds=INDEX_KINDS,
                          retrievers=retrievers or tuple(RETRIEVER_NAMES))
        if not params:
            return changed(LinkView, link=None)

        def keep(value: Any) -> Any:
            return gr.skip() if value is None else value

        swap = link.tab == "swap"
        return LinkView(
            tabs=gr.update(selected=link.tab) if link.tab else gr.skip(),
            status=format_status(as_sentence("; ".join(link.notices)), "info") if link.notices else gr.skip(),
            question=link.question if link.question and not swap else gr.skip(),
            variant=keep(None if swap else link.variant), kb=keep(link.kb), k=keep(None if swap else link.k),
            index=keep(link.index), retriever=keep(link.retriever),
            memory=gr.skip() if link.memory is None else link.memory,
            swap_question=link.question if link.question and swap else gr.skip(),
            swap_left=keep(link.left), swap_right=keep(link.right),
            swap_variant=keep(link.variant if swap else None),
            swap_k=keep(link.k if swap else None),
            link=Held(link),
        )

    def ask_linked(self, link: Held | PageLink | None, *ask_inputs: Any) -> AskView:
        """The Ask tab's ask, when the page was opened by a link with a question for it."""
        link = unwrap(link)
        if not isinstance(link, PageLink) or link.asks != "ask":
            return changed(AskView)
        self.wait_until_ready()
        view = self.ask(*ask_inputs)
        if link.notices and isinstance(view.status, str) and not view.status:  # an answer clears the box: say it again
            view = view._replace(status=format_status(as_sentence("; ".join(link.notices)), "info"))
        return view

    def swap_linked(self, link: Held | PageLink | None, *swap_inputs: Any) -> SwapView:
        """The Swap tab's ask, when the page was opened by a link to it with a question."""
        link = unwrap(link)
        if not isinstance(link, PageLink) or link.asks != "swap":
            return changed(SwapView)
        self.wait_until_ready()
        return self.swap(*swap_inputs)

    def wait_until_ready(self, timeout: float = LINK_WAIT_S, poll_s: float = 0.25) -> bool:
        """Block until an engine serves, the build fails, or `timeout` seconds pass; whether one serves. Only a
        link's own ask waits: a visitor who presses Ask while the engine starts is told to try again."""
        deadline = time.monotonic() + timeout
        while not engine_ready(self.engine) and not getattr(self.engine, "failed", False):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return engine_ready(self.engine)

    @staticmethod
    def share_link(question: str, variant: str, kb: str | None, k: float, index: str, retriever: str | None,
                   memory: bool) -> str:
        """The Ask tab's question and options as a link's query (`?tab=ask&q=...`); the page's script
        puts the page's address before it and copies it."""
        kb = None if kb == PRIVATE_KB else kb  # a visitor's own passages live in their tab only
        return link_query("ask", question, kb=kb, variant=variant, k=k, index=index, retriever=retriever,
                          memory=None if memory else False)

    @staticmethod
    def shown_link(*kbs: str | None) -> dict:
        """The link box shown once its link is copied; when one of `kbs` is the visitor's own, it says that the link
        cannot carry those passages, so that the one who opens it knows why its answer comes from another base."""
        own = PRIVATE_KB in kbs
        return gr.update(visible=True, info=("Your own knowledge base lives in this browser tab only: the link opens "
                                             "on the page's knowledge base instead.") if own else "")

    @staticmethod
    def share_swap_link(question: str, left: str | None, right: str | None, variant: str, k: float) -> str:
        """The Swap tab's question and its two knowledge bases as a link's query."""
        left, right = (None if side == PRIVATE_KB else side for side in (left, right))
        return link_query("swap", question, left=left, right=right, variant=variant, k=k)

    def exports(self, result: Held | AskResult | None, request: gr.Request | None = None) -> ExportView:
        """The last answer's JSON and heatmap CSVs, written into the visitor's own folder for download."""
        result = unwrap(result)
        session = getattr(request, "session_hash", None)
        if not isinstance(result, AskResult) or not session:
            hidden = gr.update(value=None, visible=False)
            return ExportView(answer_json=hidden, token_csv=hidden, sequence_csv=hidden)
        try:
            paths = write_exports(result, self.files.folder(session) / "exports")
        except OSError as err:  # a full disk costs the downloads, never the answer
            log.warning("could not write the answer's downloads: %s", err)
            paths = {}

        def button(key: str) -> dict:
            path = paths.get(key)
            return gr.update(value=str(path) if path else None, visible=path is not None)

        return ExportView(answer_json=button("json"), token_csv=button("token"), sequence_csv=button("sequence"))

    # ---- Learn --------------------------------------------------------------------------------
    def learn_tokens(self, result: Held | AskResult | None) -> LearnView:
        """Starts on the first token (Figure 2's interesting one)."""
        result = unwrap(result)
        choices = learn_token_choices(result)
        # hidden until an answer gives it tokens to offer: an empty menu reads as broken
        return LearnView(token_picker=gr.update(choices=choices, value=0 if choices else None, visible=bool(choices)),
                         walkthrough=format_learn_html(result, 0))

    def learn(self, result: Held | AskResult | None, position: int | None) -> str:
        return format_learn_html(unwrap(result), position)

    @staticmethod
    def carry_question(result: Held | AskResult | None, typed: str | None, carried: str | None):
        """The Score tab's question and the question last carried there: the last asked one, while the box is
        empty or still holds the question carried before (`carried`); what the visitor typed there stays."""
        result = unwrap(result)
        typed = (typed or "").strip()
        if result is None or (typed and typed != (carried or "").strip()):
            return gr.skip(), gr.skip()
        return result.question, result.question

    # ---- the end of a session -------------------------------------------------------------------
    def end_session(self, request: gr.Request) -> None:
        """The tab was closed: delete the visitor's uploaded files now."""
        session = getattr(request, "session_hash", None)
        if session:
            self.files.drop(session)

    def release_kb(self, mine: Held | KnowledgeBase | None) -> None:
        """Gradio dropped the session's knowledge base: let the engine forget its indexes too."""
        kb = unwrap(mine)
        release = getattr(self.engine, "release_kb", None)
        if isinstance(kb, KnowledgeBase) and release is not None and engine_ready(self.engine):
            release(kb)

    # ---- first start --------------------------------------------------------------------------
    def retriever_options(self) -> dict:
        """The retriever radio's choices and value: dense and BM25 always, Dense + BM25 when the engine has a lexical weight."""
        if not engine_ready(self.engine):  # no value yet: an API call then gets the engine's own default
            return {"value": None, "visible": False}
        offered = tuple(self.engine.retrievers)
        return {"choices": [(RETRIEVER_NAMES.get(r, r), r) for r in offered],
                "value": "hybrid" if "hybrid" in offered else "dense", "visible": True}

    def memory_options(self, retriever: str | None = None) -> dict:
        """The memory switch's help for this retriever (None: the engine's default) and whether it can be ticked:
        whether memory can be a source here. Before an engine serves, or from one that cannot say, the help stays
        as the page wrote it."""
        memory_logit = getattr(self.engine, "memory_logit", None)  # a wrapper may not offer it
        if memory_logit is None or not engine_ready(self.engine):
            return {}
        try:
            logit = memory_logit(parse_retriever(retriever))
        except RagDemoError as err:  # an unknown retriever, or the engine's process gone: the ask will say so
            log.warning("memory availability unknown: %s", err)
            return {}
        # greyed where it cannot be a source (BM25 has no fitted θ), its tick kept for the retriever that has one
        return {"info": memory_switch_info(logit), "interactive": logit is not None}

    def memory_update(self, retriever: str | None) -> dict:
        """When the retriever changes: the memory switch's help for it."""
        return gr.update(**self.memory_options(retriever))

    def poll(self, announced: int, link: Held | PageLink | None = None) -> PollView:
        """The banner while the engine starts or builds; the choices once it first serves, sent once;
        fresh example questions and the memory switch's help each time a better engine is swapped in.

        `announced` counts the engines the page was told of (0: none yet); `link`, the page's link,
        whose knowledge bases the first choices keep.
        """
        if not engine_ready(self.engine):
            failed = bool(getattr(self.engine, "failed", False))
            text = self.engine.status_text() if hasattr(self.engine, "status_text") else "Preparing…"
            return changed(PollView, banner=format_status(text, "error" if failed else "wait"),
                           timer=gr.Timer(active=not failed), announced=0)
        building = not engine_complete(self.engine)
        banner = format_status(self.engine.status_text(), "wait") if building else ""
        served = engines_served(self.engine)
        if announced == served:
            return changed(PollView, banner=banner, timer=gr.Timer(active=building), announced=served)
        default = self.default_kb()
        samples, swap_samples = self.examples(default), self.swap_examples()
        # a new engine may have a memory logit where the last had none: the switch's help follows it
        fresh = dict(examples=gr.Dataset(samples=samples, visible=bool(samples)),
                     swap_examples=gr.Dataset(samples=swap_samples, visible=bool(swap_samples)),
                     memory=gr.update(**self.memory_options()))
        if announced:  # a better engine over the same KBs: keep what the visitor chose
            return changed(PollView, banner=banner, timer=gr.Timer(active=building), announced=served, **fresh)
        left, right = self.swap_pair()
        link = unwrap(link)
        if isinstance(link, PageLink):  # a link opened while the engine started: its choices, where offered
            names = self.kb_names()
            default, left, right = ((chosen if chosen in names else fallback) for chosen, fallback in
                                    ((link.kb, default), (link.left, left), (link.right, right)))
        choices = self.kb_choices(None)
        return PollView(
            banner=banner, timer=gr.Timer(active=building), announced=served,
            kb=gr.update(choices=choices, value=default), swap_left=gr.update(choices=choices, value=left),
            swap_right=gr.update(choices=choices, value=right), score_kb=gr.update(choices=choices, value=default),
            idx_kb=gr.update(choices=choices, value=default), **fresh,
            retriever=gr.update(**self.retriever_options()),
        )

    def status_json(self) -> dict:
        """The API's view of the start: what serves now and what is still building."""
        status = getattr(self.engine, "status", None)
        if status is not None:
            return status()
        return {"ready": True, "complete": True, "engines_served": 1, "serving": "", "building": "", "error": "",
                "status": "ready"}
