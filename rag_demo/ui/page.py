"""The page: `build_demo(engine) -> gr.Blocks`, laid out tab by tab, each event wired to a `DemoActions`
method with its outputs named (see rag_demo.ui.actions).

The engine is shared read-only; each visitor's private knowledge base and last answer live
in `gr.State`. All events that touch the engine share one concurrency group of size 1, so two
visitors never interleave inside it. A visitor's uploaded files are moved out of gradio's shared
upload folder into a folder of their own session, deleted when the session ends.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import gradio as gr

from ..serving.interface import Engine, engine_ready
from ..config import ASK, DECODING_DEFAULTS, DECODINGS, INDEX_KINDS, LIMITS, RETRIEVER_NAMES, VARIANTS
from ..retrieval.corpus import SOURCE_SUFFIXES
from .actions import DemoActions
from .views import (
    AskView,
    CompareView,
    ExportView,
    IndexView,
    LearnView,
    LinkView,
    MineAnswerView,
    MineView,
    PassageView,
    PollView,
    ScoreView,
    SwapView,
)
from ..options import BOTH
from .html import esc, format_status
from .inputs import SessionFiles, UploadLimits
from .learn import format_glossary_html, format_learn_html
from .scripts import (CLEAR_ANSWER_STALE_JS, COPY_LINK_JS, LARGE_TEXT_JS, LOAD_JS, MARK_ANSWER_STALE_JS,
                      REMEMBER_ANSWER_OPTIONS_JS, SKIP_TO_ANSWER_HTML, SKIP_TO_ANSWER_JS, long_question_js,
                      scroll_if_linked_js, scroll_into_view_js)
from .train import EncoderChoices, encoder_choice, train_tab, training_runs

ASSETS = Path(__file__).resolve().parents[2] / "assets"
VARIANT_CHOICES = [*((variant.title(), variant) for variant in VARIANTS), ("Both", BOTH)]
INDEX_LABELS = {"flat": "Flat (exact)", "hnsw": "HNSW (graph)", "ivfpq": "IVF-PQ (compressed)"}
INDEX_CHOICES = [(INDEX_LABELS.get(kind, kind), kind) for kind in INDEX_KINDS]
DECODING_CHOICES = [(decoding, decoding) for decoding in DECODINGS]
RETRIEVER_CHOICES = [(label, name) for name, label in RETRIEVER_NAMES.items()]
ENGINE_GROUP = "engine"  # concurrency id shared by every event that calls the engine
STATE_TTL_S = 2 * 3600  # a visitor's knowledge base and last answer are dropped 2 h after their last change
# A question box takes a paste of any length: the browser would cut its end, where the question is. The box says
# at once how much of it will be read (scripts.long_question_js), and the engine refuses, with a message, what is
# longer than it accepts at all. An answer to score keeps its start, so its box may stop one character past it.
ANSWER_BOX_CHARS = LIMITS.max_answer_chars + 1

MEMORY_INFO = ("∅, the generator reading no passage, joins the k passages in p(z|x) where this setup has a "
               "fitted logit for it (also for Swap and Score); untick for the paper's k passages alone.")

INTRO = (
    '<div class="rag-header"><h1>RAG provenance explorer</h1><p>Retrieval-Augmented Generation '
    "(Lewis et al., NeurIPS 2020): a retriever picks passages, a generator writes the answer; "
    "trace each answer token back to the passages that made it likely.</p></div>"
)


# No text under 14 px: gradio's small sizes (labels' help, badges) are lifted to it, for a projector's back row.
TEXT_SIZES = dict(xxs="14px", xs="14px", sm="14px", md="15px", lg="17px", xl="22px", xxl="26px")


def launch_options() -> dict:
    """Theme, CSS and script for `demo.launch(**launch_options(), ...)` (gradio 6 takes them at launch).

    The footer keeps the API and settings links; gradio's run history ("Runs") is off: it stores each
    answer in the browser and shows charts as raw plotly JSON, which helps no visitor."""
    return {
        "theme": gr.themes.Soft(primary_hue="indigo", secondary_hue="teal", spacing_size="sm", radius_size="md",
                                text_size=gr.themes.Size(**TEXT_SIZES),
                                font=["ui-sans-serif", "system-ui", "Segoe UI", "Roboto", "sans-serif"]).set(
            # the Soft theme's indigo-500 gives 3.6:1 under labels and 4.5:1 under white button text: one shade
            # darker for fills with white text, two for coloured text, so that both pass 4.5:1
            color_accent="*primary_600", button_primary_background_fill="*primary_600",
            button_primary_background_fill_hover="*primary_700", checkbox_label_background_fill_selected="*primary_600",
            block_label_text_color="*primary_700", block_title_text_color="*primary_700"),
        "css_paths": [ASSETS / "style.css"],
        "js": LOAD_JS,
        "footer_links": ["api", "gradio", "settings"],
        "run_history": False,
    }


class DemoBlocks(gr.Blocks):
    """The page's Blocks. A plain HTTP call that sends an endpoint fewer values than it takes fails in gradio before
    any handler of ours runs, and its caller read only `{"error": null}`: the error now says what the endpoint takes."""

    def validate_inputs(self, block_fn, inputs: list[Any]):
        wanted = len(block_fn.inputs)
        if len(inputs) < wanted:
            try:
                names = list(inspect.signature(block_fn.fn).parameters)[:wanted]
            except (TypeError, ValueError):  # a callable without a signature: the count alone
                names = []
            endpoint = f"/{block_fn.api_name}" if block_fn.api_name else "this event"
            order = f", in this order: {', '.join(names)} (empty for a default)" if len(names) == wanted else ""
            raise gr.Error(f"{endpoint} takes {wanted} values{order}; the call sent {len(inputs)}", print_exception=False)
        super().validate_inputs(block_fn, inputs)


def _html(elem_id: str, value: str = "", **options: Any) -> gr.HTML:
    return gr.HTML(value, elem_id=elem_id, js_on_load=None, **options)


def _status(elem_id: str, value: str = "") -> gr.HTML:
    """A message box that takes no room while empty (see .rag-autohide in assets/style.css)."""
    return gr.HTML(value, elem_id=elem_id, js_on_load=None, elem_classes=["rag-autohide"])


def build_demo(engine: Engine, *, limits: UploadLimits = UploadLimits(), files: SessionFiles | None = None) -> gr.Blocks:
    """The page for `engine`. Launch it with `demo.launch(**launch_options())`; the queue is set here.

    `files` holds visitors' uploads (default: a new private temporary folder).
    """
    runs = training_runs(engine)  # the visitors' Train runs: the Train tab trains them, Ask, Score and Swap ask with them
    actions = DemoActions(engine, limits=limits, files=files, runs=runs)
    default = actions.default_kb()
    left_default, right_default = actions.swap_pair()
    kb_choices = actions.kb_choices(None)
    samples, swap_samples = actions.examples(default), actions.swap_examples()
    ready = engine_ready(engine)

    def kb_dropdown(elem_id: str, value: str | None, label: str = "Knowledge base") -> gr.Dropdown:
        # The choices reach the page once the engine is ready; API calls see only the choices the
        # page was built with, so names are checked by `resolve_kb` instead of by gradio.
        return gr.Dropdown(kb_choices, value=value, label=label, elem_id=elem_id, min_width=150,
                           allow_custom_value=True, elem_classes=["rag-fit-dropdown"])

    def question_box(elem_id: str) -> gr.Textbox:
        # one line that grows to four: Enter asks, as in a search box, and Shift+Enter breaks the line
        return gr.Textbox(label="Question", lines=1, max_lines=4, elem_id=elem_id,
                          placeholder="Ask a factual question, or click an example below")

    def link_box(elem_id: str) -> gr.Textbox:
        # hidden until "Copy link": then the link, selectable, for a browser that refuses the clipboard
        return gr.Textbox(label="Link to this question (copied)", elem_id=elem_id, visible=False, interactive=False,
                          buttons=["copy"], lines=1, max_lines=3)

    def index_dropdown(elem_id: str) -> gr.Dropdown:
        return gr.Dropdown(INDEX_CHOICES, value=ASK.index, label="Index variant", elem_id=elem_id, min_width=150)

    def k_slider(elem_id: str) -> gr.Slider:
        return gr.Slider(1, LIMITS.max_k, value=ASK.k, step=1, label="k passages", elem_id=elem_id, min_width=150,
                         info="more passages: slower answers")

    with DemoBlocks(title="RAG provenance explorer", delete_cache=(3600, 3600)) as demo:
        def release_kb(value: Any) -> None:
            # A plain function, not a bound method: gradio deep-copies components' arguments for every new
            # session, and a bound method would be copied with its object (the engine: gigabytes per visitor).
            actions.release_kb(value)

        # Held(KnowledgeBase): this visitor's own passages; gradio deletes it 1 h after the tab closes (or after the TTL)
        mine = gr.State(None, time_to_live=STATE_TTL_S, delete_callback=release_kb)
        last = gr.State(None, time_to_live=STATE_TTL_S)  # Held(AskResult): the last answer, for Learn
        announced = gr.State(0)
        link = gr.State(None)  # Held(PageLink): what the page's link asked for, None when it had no query
        with gr.Row(equal_height=True, elem_classes=["rag-top"]):
            gr.HTML(INTRO, js_on_load=None, scale=5)
            large_text = gr.Checkbox(False, label="Large text (projector)", elem_id="large-text", scale=1,
                                     min_width=200, container=False)
        banner = _status("status-banner", "" if ready else format_status("Preparing models and indexes…", "wait"))
        timer = gr.Timer(1.0, active=not ready)

        # on phones the tab names wrap onto a second line instead of hiding behind an unlabeled "⋯"
        with gr.Tabs(elem_id="tabs", overflow_behavior="wrap") as tabs:
            # ---------------------------------------------------------------- Ask
            with gr.Tab("Ask", id="ask", elem_id="tab-ask"):
                with gr.Row():
                    with gr.Column(scale=1, min_width=330, elem_classes=["rag-sidebar"]):
                        question = question_box("question")
                        with gr.Row(equal_height=True):
                            ask_btn = gr.Button("Ask", variant="primary", elem_id="ask-btn", size="md", scale=3)
                            share_btn = gr.Button("Copy link", elem_id="share-btn", size="md", scale=1, min_width=110)
                        share_box = link_box("share-link")
                        gr.HTML(SKIP_TO_ANSWER_HTML, elem_id="skip-to-answer", js_on_load=SKIP_TO_ANSWER_JS)
                        variant = gr.Radio(VARIANT_CHOICES, value=ASK.variant, label="RAG variant", elem_id="variant")
                        # one above the other: side by side, "wikipedia-counterfactual" and "IVF-PQ (compressed)" are cut
                        kb = kb_dropdown("kb", default)
                        index = index_dropdown("index")
                        examples = gr.Dataset(components=[question], samples=samples, elem_id="examples",
                                              label="Examples", samples_per_page=8, layout="gallery",
                                              visible=bool(samples))
                        with gr.Row():
                            k = k_slider("k")
                            beams = gr.Slider(1, LIMITS.max_beams, value=1, step=1, label="Beams", elem_id="beams",
                                              min_width=140, info="more beams: slower answers")
                        decoding = gr.Radio(DECODING_CHOICES, value=DECODING_DEFAULTS.sequence_decoding, label="RAG-Sequence decoding",
                                            elem_id="seq-decoding")
                        retriever = gr.Radio(label="Retriever", elem_id="retriever",
                                             **{"choices": RETRIEVER_CHOICES, **actions.retriever_options()})
                        # this visitor's Train run offers its encoder here once it has taken a step (train.offered_encoder)
                        question_encoder = encoder_choice("question-encoder")
                        compare_btn = gr.Button("Compare retrievers", elem_id="compare-btn", size="sm")
                        extractive = gr.Checkbox(False, label="Answers copy a passage span", elem_id="extractive",
                                                 info="Decoding may only copy a run of a retrieved passage's words; "
                                                      "the probabilities shown stay the model's own.")
                        # read by the Swap and Score tabs too: one switch for every answer on the page
                        memory = gr.Checkbox(True, label="Generator's memory as a source", elem_id="memory",
                                             **{"info": MEMORY_INFO, **actions.memory_options()})
                    with gr.Column(scale=3, min_width=600):
                        # the hint sits in the message box, so that an error replaces it instead of joining it
                        ask_status = _status("ask-status", format_status("Ask a question, or click an example.", "info"))
                        comparison = _html("compare")  # empty until "Compare retrievers"; a new ask clears it
                        answer = _html("answer")
                        with gr.Row(elem_id="downloads", elem_classes=["rag-downloads"]):
                            download_json = gr.DownloadButton("Answer as JSON", elem_id="download-json", size="sm",
                                                              visible=False, min_width=150)
                            download_token = gr.DownloadButton("RAG-Token heatmap CSV", elem_id="download-token-csv",
                                                               size="sm", visible=False, min_width=190)
                            download_seq = gr.DownloadButton("RAG-Sequence heatmap CSV", elem_id="download-seq-csv",
                                                             size="sm", visible=False, min_width=210)
                        with gr.Row():
                            with gr.Column(scale=3, min_width=320):
                                passages = _html("passages", max_height=760)
                            with gr.Column(scale=2, min_width=260):
                                doc_prob = gr.Plot(label="p(z|x)", elem_id="doc-prob", show_label=False, visible=False)
                with gr.Row():  # side by side on a wide screen, one under the other on a phone
                    with gr.Column(min_width=420):
                        heat_token = gr.Plot(label="RAG-Token posterior", elem_id="heat-token", show_label=False, visible=False)
                    with gr.Column(min_width=420):
                        heat_seq = gr.Plot(label="RAG-Sequence posterior", elem_id="heat-seq", show_label=False, visible=False)
                gain = gr.Plot(label="Retrieval gain", elem_id="gain", show_label=False, visible=False)

            # ---------------------------------------------------------------- Swap
            with gr.Tab("Swap the index", id="swap", elem_id="tab-swap"):
                with gr.Row():
                    with gr.Column(scale=1, min_width=330, elem_classes=["rag-sidebar"]):
                        swap_question = question_box("swap-question")
                        with gr.Row(equal_height=True):
                            swap_btn = gr.Button("Ask both", variant="primary", elem_id="swap-btn", size="md", scale=3)
                            swap_share_btn = gr.Button("Copy link", elem_id="swap-share-btn", size="md", scale=1,
                                                       min_width=110)
                        swap_share_box = link_box("swap-share-link")
                        # one per line: two side by side cut long KB names such as "wikipedia-counterfactual"
                        swap_left = kb_dropdown("swap-left", left_default, "Left knowledge base")
                        swap_right = kb_dropdown("swap-right", right_default, "Right knowledge base")
                        swap_variant = gr.Radio(VARIANT_CHOICES, value="token", label="RAG variant",
                                                elem_id="swap-variant")
                        swap_k = k_slider("swap-k")
                        swap_encoder = encoder_choice("swap-question-encoder")  # as the Ask tab's
                        swap_examples = gr.Dataset(components=[swap_question], samples=swap_samples, label="Examples",
                                                   elem_id="swap-examples", samples_per_page=8, layout="gallery",
                                                   visible=bool(swap_samples))
                    with gr.Column(scale=3, min_width=600):
                        gr.HTML('<p class="rag-help">The same model answers the same question against two knowledge '
                                "bases. <b>wikipedia-counterfactual</b> holds the passages of <b>wikipedia</b> with "
                                "people's names permuted: each person whose article is in the base takes another's "
                                "name (within an occupation where it can: a painter takes a painter's), everywhere that name appears. Its passages are false on "
                                "purpose, and consistently so: an answer that follows them was read from the index, "
                                "not remembered by the model. (<b>nq-counterfactual</b>, where it is built, does the "
                                "same to <b>nq-wiki</b>'s answers, from BIG-bench's knowledge-conflict task.) In the "
                                "paper, swapping a 2016 Wikipedia index for a 2018 one updated answers about world "
                                "leaders without retraining: the knowledge lives in the index.</p>", js_on_load=None)
                        swap_status = _status("swap-status")
                        swap_summary = _html("swap-summary")
                        with gr.Row():  # side by side; stacked on a narrow screen
                            with gr.Column(min_width=320):
                                swap_left_out = _html("swap-left-out")
                            with gr.Column(min_width=320):
                                swap_right_out = _html("swap-right-out")

            # ---------------------------------------------------------------- Your knowledge
            with gr.Tab("Your knowledge", id="mine", elem_id="tab-mine"):
                gr.HTML(f'<p class="rag-help">{esc(limits.describe())}</p>', js_on_load=None)
                with gr.Row():
                    with gr.Column(scale=1, min_width=360):
                        mine_files = gr.File(label="Upload text files", file_count="multiple",
                                             file_types=list(SOURCE_SUFFIXES), elem_id="mine-files", height=150)
                        mine_paste_title = gr.Textbox(label="Title for pasted text", elem_id="mine-paste-title",
                                                      placeholder="Pasted text")
                        mine_paste = gr.Textbox(label=f"…or paste text (≤ {limits.max_paste_chars:,} characters)", lines=5,
                                                max_lines=12, elem_id="mine-paste")
                        mine_build = gr.Button("Build my knowledge base", variant="primary", elem_id="mine-build")
                        mine_status = _html("mine-status", format_status(
                            "No knowledge base yet: upload or paste text, then build it.", "info"), min_height=70)
                    # nothing to edit before a build: the editor appears with the knowledge base (MineView.editor)
                    with gr.Column(scale=1, min_width=360, visible=False, elem_id="mine-editor") as mine_editor:
                        mine_pick = gr.Dropdown([], value=None, label="Edit a passage", elem_id="mine-passage",
                                                type="value", elem_classes=["rag-fit-dropdown"])
                        mine_edit_title = gr.Textbox(label="Title", elem_id="mine-edit-title")
                        mine_edit_text = gr.Textbox(label="Text (empty removes the passage)", lines=4, max_lines=10,
                                                    elem_id="mine-edit-text")
                        mine_save = gr.Button("Save passage and re-index", elem_id="mine-save")
                        mine_preview = _html("mine-preview", max_height=220)
                with gr.Row(equal_height=True):
                    mine_question = gr.Textbox(label="Ask your knowledge base", elem_id="mine-question", scale=6)
                    mine_ask = gr.Button("Ask", variant="primary", elem_id="mine-ask", scale=1, min_width=110)
                mine_ask_status = _status("mine-ask-status")
                mine_answer = _html("mine-answer")
                mine_passages = _html("mine-passages", max_height=400)

            # ---------------------------------------------------------------- Score
            with gr.Tab("Score your answer", id="score", elem_id="tab-score"):
                gr.HTML('<p class="rag-help">Type an answer of your own: both variants score it, log p(answer | question), '
                        "with the per-token provenance of each word.</p>", js_on_load=None)
                with gr.Row(equal_height=True, elem_classes=["rag-stack-narrow"]):
                    score_question = gr.Textbox(label="Question", elem_id="score-question", scale=4)
                    score_carried = gr.State("")  # the question last carried in from an ask, to tell it from a typed one
                    score_answer = gr.Textbox(label="Your answer", elem_id="score-answer", scale=3,
                                              max_length=ANSWER_BOX_CHARS)
                    score_btn = gr.Button("Score", variant="primary", elem_id="score-btn", scale=1, min_width=110)
                with gr.Row(elem_classes=["rag-options", "rag-stack-narrow"]):
                    score_kb = kb_dropdown("score-kb", default)
                    score_k = k_slider("score-k")
                    score_index = index_dropdown("score-index")
                    score_encoder = encoder_choice("score-question-encoder")  # as the Ask tab's
                score_status = _status("score-status")
                score_out = _html("score-out")
                with gr.Row():
                    with gr.Column(min_width=420):
                        score_heat_token = gr.Plot(elem_id="score-heat-token", show_label=False, visible=False)
                    with gr.Column(min_width=420):
                        score_heat_seq = gr.Plot(elem_id="score-heat-seq", show_label=False, visible=False)
                score_gain = gr.Plot(elem_id="score-gain", show_label=False, visible=False)

            # ---------------------------------------------------------------- Index variants
            with gr.Tab("Index variants", id="index", elem_id="tab-index"):
                gr.HTML('<p class="rag-help">Exact (flat) search against two approximate indexes: an HNSW graph and '
                        "IVF-PQ (the paper's compressed index: 36 GB instead of about 100 GB). Recall@k is measured against "
                        "flat; the Ask tab shows the chosen variant's recall next to every answer.</p>", js_on_load=None)
                with gr.Row(equal_height=True):
                    idx_kb = kb_dropdown("idx-kb", default)
                    idx_btn = gr.Button("Compare index variants", variant="primary", elem_id="idx-btn", min_width=200)
                idx_status = _status("idx-status")
                idx_table = _html("idx-table")
                idx_plot = gr.Plot(elem_id="idx-plot", show_label=False, visible=False)

            # ---------------------------------------------------------------- Learn
            with gr.Tab("Learn", id="learn", elem_id="tab-learn"):
                gr.HTML('<p class="rag-help">The two RAG equations, worked through with the numbers of your last '
                        "question in the Ask tab.</p>", js_on_load=None)
                learn_token = gr.Dropdown([], value=None, label="Answer token for step 2", elem_id="learn-token",
                                          type="value", min_width=240, elem_classes=["rag-fit-dropdown"], visible=False)
                learn_out = _html("learn-out", format_learn_html(None))
                with gr.Accordion("Words used on this page", open=False, elem_id="glossary"):
                    gr.HTML(format_glossary_html(), js_on_load=None)

            train_tab(engine, runs=runs,  # its own module: rag_demo.ui.train
                      encoders=EncoderChoices(ask=question_encoder, score=score_encoder, swap=swap_encoder))

        # ---------------------------------------------------------------- events
        # Each event's outputs, by name: the components an action's values go to (rag_demo.ui.actions)
        kb_menus = dict(kb=kb, swap_left=swap_left, swap_right=swap_right, score_kb=score_kb, idx_kb=idx_kb)
        poll_view = PollView(banner=banner, timer=timer, announced=announced, **kb_menus, examples=examples,
                             swap_examples=swap_examples, retriever=retriever, memory=memory)
        ask_view = AskView(status=ask_status, answer=answer, passages=passages, doc_prob=doc_prob, heat_token=heat_token,
                           heat_seq=heat_seq, gain=gain, last=last, question_encoder=question_encoder)
        compare_view = CompareView(status=ask_status, comparison=comparison)
        swap_view = SwapView(status=swap_status, summary=swap_summary, left=swap_left_out, right=swap_right_out,
                             question_encoder=swap_encoder)
        mine_view = MineView(status=mine_status, mine=mine, picker=mine_pick, edit_title=mine_edit_title,
                             edit_text=mine_edit_text, preview=mine_preview, ask_status=mine_ask_status,
                             editor=mine_editor, **kb_menus)
        mine_answer_view = MineAnswerView(status=mine_ask_status, answer=mine_answer, passages=mine_passages)
        score_view = ScoreView(status=score_status, cards=score_out, heat_token=score_heat_token, heat_seq=score_heat_seq,
                               gain=score_gain, question_encoder=score_encoder)
        index_view = IndexView(status=idx_status, table=idx_table, figure=idx_plot)
        learn_view = LearnView(token_picker=learn_token, walkthrough=learn_out)

        engine_events = dict(concurrency_id=ENGINE_GROUP, concurrency_limit=1)
        # a question asked while the last one runs is asked after it, never dropped (gradio's "once" would
        # drop it); each answer names the question it answers, so none shows under another's text
        latest = dict(trigger_mode="always_last")
        link_view = LinkView(tabs=tabs, status=ask_status, question=question, variant=variant, kb=kb, k=k, index=index,
                             retriever=retriever, memory=memory, swap_question=swap_question, swap_left=swap_left,
                             swap_right=swap_right, swap_variant=swap_variant, swap_k=swap_k, link=link)
        export_view = ExportView(answer_json=download_json, token_csv=download_token, sequence_csv=download_seq)
        # the link is read after the first poll, so that the knowledge bases the poll offers do not replace its own
        opened = demo.load(actions.poll, inputs=[announced, link], outputs=list(poll_view), api_visibility="private",
                           show_progress="hidden", queue=False).then(
            actions.open_link, outputs=list(link_view), api_visibility="private", show_progress="hidden", queue=False)
        timer.tick(actions.poll, inputs=[announced, link], outputs=list(poll_view), api_visibility="private",
                   show_progress="hidden", queue=False)
        large_text.change(None, inputs=large_text, js=LARGE_TEXT_JS, api_visibility="private", queue=False)
        for box, status in ((question, ask_status), (swap_question, swap_status)):
            box.change(None, inputs=[box, status], outputs=status, api_visibility="private", queue=False,
                       js=long_question_js(LIMITS.max_question_chars, LIMITS.max_input_chars))

        # On a narrow screen the controls stack above the results: bring the results into view when
        # an ask starts (the progress shows there) and again when it is answered (the page has grown)
        scroll_to = {name: dict(fn=None, js=scroll_into_view_js(name), queue=False, api_visibility="private")
                     for name in ("answer", "swap-summary", "score-out", "compare")}
        gr.on([ask_btn.click, question.submit, examples.click], **scroll_to["answer"])
        ask_options = [variant, kb, index, k, beams, decoding, retriever, question_encoder, extractive, memory]
        answer.change(None, inputs=ask_options, js=REMEMBER_ANSWER_OPTIONS_JS, queue=False, api_visibility="private")
        gr.on([control.input for control in ask_options], None, inputs=ask_options, js=MARK_ANSWER_STALE_JS,
              queue=False, api_visibility="private")
        gr.on([ask_btn.click, question.submit], None, inputs=question, js=CLEAR_ANSWER_STALE_JS, queue=False,
              api_visibility="private")
        examples.click(None, js=CLEAR_ANSWER_STALE_JS, queue=False, api_visibility="private")
        gr.on([swap_btn.click, swap_question.submit, swap_examples.click], **scroll_to["swap-summary"])
        gr.on([score_btn.click, score_answer.submit], **scroll_to["score-out"])
        ask_inputs = [question, variant, k, index, kb, beams, decoding, mine, retriever, extractive, memory, question_encoder]
        opened.then(actions.ask_linked, inputs=[link, *ask_inputs], outputs=list(ask_view), api_visibility="private",
                    show_progress_on=answer, **engine_events).then(
            None, js=scroll_if_linked_js("answer", swap=False), queue=False, api_visibility="private")
        last.change(actions.exports, inputs=last, outputs=list(export_view), api_visibility="private", queue=False)
        share_btn.click(actions.share_link, inputs=[question, variant, kb, k, index, retriever, memory],
                        outputs=share_box, api_visibility="private", queue=False).then(
            None, inputs=share_box, outputs=share_box, js=COPY_LINK_JS, api_visibility="private", queue=False).then(
            actions.shown_link, inputs=kb, outputs=share_box, api_visibility="private", queue=False)
        # one progress bar, where the answer will show: it names the step that runs (engine.ask)
        gr.on([ask_btn.click, question.submit], actions.ask, inputs=ask_inputs, outputs=list(ask_view), api_name="ask",
              show_progress_on=answer, **engine_events, **latest).then(**scroll_to["answer"])
        # the comparison above the answer belongs to an earlier question once a new one is asked
        gr.on([ask_btn.click, question.submit, examples.click], lambda: "", outputs=comparison, api_visibility="private",
              queue=False)
        compare_btn.click(**scroll_to["compare"])
        compare_btn.click(actions.compare, inputs=[question, kb, k, mine], outputs=list(compare_view), api_name="compare",
                          show_progress_on=comparison, **engine_events).then(**scroll_to["compare"])
        examples.click(lambda sample: sample[0] if sample else gr.skip(), inputs=examples, outputs=question,
                       api_visibility="private", queue=False).then(
            actions.ask, inputs=ask_inputs, outputs=list(ask_view), api_visibility="private", show_progress_on=answer,
            **engine_events).then(**scroll_to["answer"])
        kb.change(actions.examples_update, inputs=kb, outputs=examples, api_visibility="private", queue=False)
        retriever.change(actions.memory_update, inputs=retriever, outputs=memory, api_visibility="private", queue=False)
        last.change(actions.learn_tokens, inputs=last, outputs=list(learn_view), api_visibility="private", queue=False)
        last.change(actions.carry_question, inputs=[last, score_question, score_carried],
                    outputs=[score_question, score_carried], api_visibility="private", queue=False)
        learn_token.change(actions.learn, inputs=[last, learn_token], outputs=learn_out, api_visibility="private",
                           queue=False)

        swap_inputs = [swap_question, swap_left, swap_right, swap_variant, swap_k, mine, memory, swap_encoder]
        opened.then(actions.swap_linked, inputs=[link, *swap_inputs], outputs=list(swap_view), api_visibility="private",
                    show_progress_on=swap_summary, **engine_events).then(
            None, js=scroll_if_linked_js("swap-summary", swap=True), queue=False, api_visibility="private")
        swap_share_btn.click(actions.share_swap_link, inputs=[swap_question, swap_left, swap_right, swap_variant, swap_k],
                             outputs=swap_share_box, api_visibility="private", queue=False).then(
            None, inputs=swap_share_box, outputs=swap_share_box, js=COPY_LINK_JS, api_visibility="private",
            queue=False).then(actions.shown_link, inputs=[swap_left, swap_right], outputs=swap_share_box,
                              api_visibility="private", queue=False)
        gr.on([swap_btn.click, swap_question.submit], actions.swap, inputs=swap_inputs, outputs=list(swap_view),
              api_name="swap", show_progress_on=swap_summary, **engine_events, **latest).then(**scroll_to["swap-summary"])
        swap_examples.click(lambda sample: sample[0] if sample else gr.skip(), inputs=swap_examples,
                            outputs=swap_question, api_visibility="private", queue=False).then(
            actions.swap, inputs=swap_inputs, outputs=list(swap_view), api_visibility="private",
            show_progress_on=swap_summary, **engine_events).then(**scroll_to["swap-summary"])

        mine_build.click(actions.build_mine, inputs=[mine_files, mine_paste_title, mine_paste, mine],
                         outputs=list(mine_view), api_name="build_kb", show_progress_on=mine_status, **engine_events)
        mine_pick.change(actions.pick_passage, inputs=[mine_pick, mine],
                         outputs=list(PassageView(title=mine_edit_title, text=mine_edit_text)),
                         api_visibility="private", queue=False)
        mine_save.click(actions.save_passage, inputs=[mine_pick, mine_edit_title, mine_edit_text, mine],
                        outputs=list(mine_view), api_name="edit_passage", show_progress_on=mine_status, **engine_events)
        gr.on([mine_ask.click, mine_question.submit], actions.ask_mine, inputs=[mine_question, mine],
              outputs=list(mine_answer_view), api_name="ask_mine", show_progress_on=mine_answer, **engine_events)

        gr.on([score_btn.click, score_answer.submit], actions.score,
              inputs=[score_question, score_answer, score_kb, score_k, score_index, mine, memory, score_encoder],
              outputs=list(score_view),
              api_name="score", show_progress_on=score_out, **engine_events, **latest).then(**scroll_to["score-out"])
        idx_btn.click(actions.index_reports, inputs=[idx_kb, mine], outputs=list(index_view), api_name="index_reports",
                      **engine_events)

        def ask_json(question: str, variant: str = ASK.variant, k: int = ASK.k, index: str = ASK.index, kb: str = "",
                     retriever: str = "", extractive: bool = False, memory: bool | None = None) -> dict:
            """Ask a question; returns the full AskResult as JSON. variant: token, sequence or both;
            retriever: dense, bm25, hybrid, or empty for the engine's default; extractive: answers copy a passage span;
            memory: the generator's memory as a source (memory_prob, memory_posteriors): empty on where this setup has
            a fitted logit, true required, false the paper's k passages alone."""
            return actions.ask_json(question, variant, k, index, kb, retriever, extractive, memory)

        gr.api(ask_json, api_name="ask_json", **engine_events)

        def score_json(question: str, answer: str, kb: str = "", k: int = ASK.k, index: str = ASK.index, variant: str = ASK.variant,
                       retriever: str = "", memory: bool | None = None) -> dict:
            """log p(answer | question) under each variant with per-token provenance; returns the AskResult as JSON.
            memory: as for ask_json."""
            return actions.score_json(question, answer, kb, k, index, variant, retriever, memory)

        gr.api(score_json, api_name="score_json", **engine_events)

        def compare_json(question: str, kb: str = "", k: int = ASK.k) -> dict:
            """The top k passages of each retriever (dense, bm25, and hybrid when offered) for one question, by exact
            search; returns the RetrieverComparison as JSON, with the gold passage's rank where the KB knows it."""
            return actions.compare_json(question, kb, k)

        gr.api(compare_json, api_name="compare_json", **engine_events)

        def status_json() -> dict:
            """How far the start has come: ready (an engine answers), complete (nothing is building), serving (which
            parts answer), building (what is still being built), step/done/total (the build's progress), error."""
            return actions.status_json()

        gr.api(status_json, api_name="status_json", queue=False)  # never waits behind an ask
        demo.unload(actions.end_session)

    demo.queue(default_concurrency_limit=1)
    return demo
