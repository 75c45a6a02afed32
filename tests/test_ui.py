"""The UI without a browser: formatters, figures and event callbacks called directly.

The callbacks run on `ui_engine`, a real `RagEngine` over tiny random models (tests/ui_engine.py).
Its answers are deterministic but meaningless, so the tests compare what the UI shows with what
the engine computed for the same inputs, and check the numbers against the RAG equations.
"""

from __future__ import annotations

import json
import html
import math
import re
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest

from rag_demo import plots
from rag_demo.serving.background import Answering, BackgroundEngine, Stage
from rag_demo.config import LIMITS
from rag_demo.retrieval.corpus import Passage
from rag_demo.errors import InputError, RagDemoError
from rag_demo.results import AskResult, ClosedBookResult, IndexReport, RetrievedPassage, VariantResult
from rag_demo.ui import build_demo
from rag_demo.ui.actions import KB_MENUS, PRIVATE_KB, PRIVATE_LABEL, PRIVATE_NAME, DemoActions, Held, unwrap
from rag_demo.ui.html import (
    esc,
    fmt_log,
    fmt_prob,
    fmt_signed,
    format_answer_html,
    format_score_html,
    format_status,
    format_swap_summary,
    format_timings,
    format_token_spans,
    swap_verdict,
)
from rag_demo.ui.passage_cards import format_comparison_html, format_passages_html, format_swap_column
from rag_demo.ui.index_table import format_index_table
from rag_demo.ui.inputs import UploadLimits, passages_from_inputs
from rag_demo.ui.learn import format_learn_html
from rag_demo.ui.page import ENGINE_GROUP
from tests.ui_engine import KB_NAMES, QUESTIONS

EVIL_TITLE = '<img src=x onerror="window.__pwned=1">Evil & co'
EVIL_TEXT = "<script>window.__pwned=2</script> Paris <b>bold</b> is where the evil passage lives <img src=x onerror=window.__pwned=3>"
QUESTION = QUESTIONS[0]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture()
def actions(ui_engine):
    return DemoActions(ui_engine)


def ask(actions, question=QUESTION, variant="both", kb=None, mine=None, k=3, index="flat", beams=1,
        decoding="thorough", retriever=None, extractive=False):
    """The Ask tab's event with these settings."""
    return actions.ask(question, variant, k, index, kb or actions.engine.default_kb, beams, decoding, mine, retriever,
                       extractive)


def shown(token: str) -> str:
    """A token as the answer cards write it."""
    return "∅" if token == "" else esc(token).replace("\n", "↵")


def softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    return [w / sum(weights) for w in weights]


def is_skip(value) -> bool:
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1


def assert_no_raw_html(markup: str) -> None:
    for needle in ("<script", "<img", "<b>bold", "<b>x", "<b>flat", "<i>plain", "<kb>", "<x>", "x</b>"):
        assert needle not in markup, needle


def evil_result() -> AskResult:
    """A hand-made result whose every string is hostile; the numbers are consistent (T=2, K=2)."""
    passages = (
        RetrievedPassage(rank=1, id=0, title=EVIL_TITLE, text=EVIL_TEXT, score=0.9, prob=0.75, logit=0.9),
        RetrievedPassage(rank=2, id=1, title="<i>plain</i>", text="a & b < c", score=0.8, prob=0.25, logit=0.8),
    )
    posteriors = ((0.9, 0.1), (0.6, 0.4))
    variant = VariantResult(
        variant="token", answer="<b>x</b>", tokens=("<b>", "x</b>"), token_ids=(1, 2), logprob=-1.0,
        token_logprobs=(-0.5, -0.5), doc_token_logprobs=((-0.2, -1.5), (-0.6, -0.4)), posteriors=posteriors,
        closed_book_token_logprobs=(-2.0, -0.1), candidates=(("<script>c</script>", -1.0),),
        set_aside=("<script>set aside</script>",),
    )
    closed = ClosedBookResult(answer="<img src=x onerror=alert(1)>", tokens=("<img src=x onerror=alert(1)>",),
                              token_logprobs=(-1.0,), logprob=-1.0, set_aside=("<b>closed aside</b>",))
    return AskResult(question="<script>q</script>?", kb="<kb>", index="flat", k=2, passages=passages,
                     variants={"token": variant}, closed_book=closed, timings_ms={"encode": 1.0, "<x>": 2.0},
                     notices=("<img src=x onerror=alert(2)>",), index_recall=1.0, scale=1.0)


# ---- formatters ----------------------------------------------------------------------------


def test_formatters_escape_every_string():
    from dataclasses import replace

    result = evil_result()
    for markup in (
        format_answer_html(result),
        format_passages_html(result.passages),
        format_swap_column(result),
        format_swap_summary(result, result),
        format_swap_summary(replace(result, question_encoder="<b>x</b>"), replace(result, question_encoder="<i>plain</i>")),
        format_score_html(result),
        format_score_html(replace(result, question_encoder="<script>enc</script>")),
        format_learn_html(result, 1),
        format_status("<img src=x onerror=alert(1)>"),
        format_index_table([IndexReport("<b>flat</b>", 0.1, 10, 1.0, 5, 0.1)], "<kb>"),
    ):
        assert_no_raw_html(markup)
    answer_html = format_answer_html(result)
    assert "set aside, restates the question: “&lt;script&gt;set aside&lt;/script&gt;”" in answer_html
    assert "“&lt;b&gt;closed aside&lt;/b&gt;”" in answer_html
    assert "set aside" not in format_answer_html(replace(result, variants={"token": replace(result.variants["token"], set_aside=())},
                                                         closed_book=replace(result.closed_book, set_aside=())))
    passages_html = format_passages_html(result.passages)
    assert "&lt;script&gt;window.__pwned=2&lt;/script&gt;" in passages_html
    assert "&lt;img src=x onerror=&quot;window.__pwned=1&quot;&gt;Evil &amp; co" in passages_html


def test_plot_labels_are_escaped():
    result = evil_result()
    figs = [plots.doc_prob_figure(result), plots.posterior_heatmap(result.variants["token"], result.passages),
            plots.retrieval_gain_figure(list(result.variants.values()))]
    for fig in figs:
        text = json.dumps(fig.to_plotly_json(), default=str)
        assert "<img" not in text and "<script" not in text and "<b>" not in text


def test_token_spans_tint_by_dominant_passage_and_show_closed_book():
    result = evil_result()
    markup = format_token_spans(result.variants["token"], result.passages)
    assert markup.count('tabindex="0"') == 2
    first, second = re.split(r'<span class="rag-tok[ "]', markup)[1:]
    assert plots.rgba(plots.passage_color(1), 0.12 + 0.6 * 0.9) in first  # argmax posterior = passage 1
    assert "0.135" in first  # closed-book p = exp(-2)
    assert "rag-parametric" in second  # closed-book p = exp(-0.1) >= 0.5


def test_the_stop_token_is_marked_and_its_gain_shown_apart():
    from dataclasses import replace

    result = evil_result()
    variant = replace(
        result.variants["token"], answer="George Washington", tokens=(" George", " Washington", "\n\n"), token_ids=(1, 2, 3),
        token_logprobs=(-3.0, -0.25, -0.25), logprob=-3.5, closed_book_token_logprobs=(-1.0, -0.25, -2.25),
        doc_token_logprobs=((-2.9, -4.0), (-0.2, -0.5), (-0.2, -0.4)), posteriors=((0.8, 0.2), (0.7, 0.3), (0.8, 0.2)),
    )
    scored = replace(result, variants={"token": variant})
    # the words lose 2 nats with the passages, stopping after them gains 2: the total alone hides both
    assert "<b>+0.00</b> nats: −2.00 for the words, +2.00 for ending the answer there (“↵↵”)" in format_score_html(scored)
    spans = re.split(r'<span class="rag-tok[ "]', format_token_spans(variant, result.passages))[1:]
    assert "it ends the answer" in spans[2] and "rag-special" in spans[2]
    assert not any("ends the answer" in span or "rag-special" in span for span in spans[:2])
    plain = replace(variant, tokens=(" George", " Washington", " Jr"))  # no stop token: nothing to split
    assert "for the words" not in format_score_html(replace(result, variants={"token": plain}))


def test_format_helpers():
    import doctest

    import rag_demo.text
    import rag_demo.ui.actions
    import rag_demo.ui.html
    import rag_demo.ui.inputs
    import rag_demo.ui.learn

    assert fmt_prob(0.5) == "0.500"
    assert fmt_prob(2.5e-7) == "2.50 × 10⁻⁷" and fmt_prob(0.001) == "0.001"
    for module in (rag_demo.text, rag_demo.ui.actions, rag_demo.ui.html, rag_demo.ui.inputs, rag_demo.ui.learn):
        assert doctest.testmod(module).failed == 0
    assert fmt_log(float("-inf")) == "−∞"
    assert format_status("") == ""
    assert "rag-status-error" in format_status("boom")
    timings = format_timings({"total": 10.0, "search": 1.0, "encode": 2.0, "generate": 7.0})
    assert timings.index("encode") < timings.index("search") < timings.index("generate") < timings.index("total")
    # what the search and an approximate index's recall check time, in their hover text
    checked = format_timings({"search": 1.0, "recall check": 3.0})
    assert 'title="finding and weighing the passages' in checked and 'title="the exact search an approximate' in checked


def test_learn_numbers_come_from_the_result(actions):
    result = unwrap(ask(actions, k=4).last)
    variant = result.variants["token"]
    t = 0
    marginal = sum(p.prob * math.exp(lp) for p, lp in zip(result.passages, variant.doc_token_logprobs[t]))
    assert math.isclose(marginal, math.exp(variant.token_logprobs[t]), rel_tol=1e-3)
    markup = format_learn_html(result, t)
    assert fmt_prob(marginal) in markup
    # softmax(scale * score) reproduces the engine's p(z|x)
    prior = softmax([result.scale * p.score for p in result.passages])
    assert [round(x, 4) for x in prior] == pytest.approx([p.prob for p in result.passages], abs=2e-4)
    assert f"<b>{prior[0]:.4f}</b>" in markup
    sequence = result.variants["sequence"]
    p_seq = sum(p.prob * math.exp(sum(row[j] for row in sequence.doc_token_logprobs))
                for j, p in enumerate(result.passages))
    assert math.isclose(p_seq, math.exp(sequence.logprob), rel_tol=1e-3)  # thorough decoding: the full sum
    assert fmt_prob(p_seq) in markup
    assert "Ask a question" in format_learn_html(None)
    # one passage is named in the singular
    one = format_learn_html(unwrap(ask(actions, k=1).last), 0)
    assert "The top passage becomes a distribution" in one and "those 1" not in one and "top 1 become" not in one


# ---- figures -------------------------------------------------------------------------------


def test_figures_have_titles_axes_and_legends(actions):
    result = unwrap(ask(actions, k=3).last)
    heat = plots.posterior_heatmap(result.variants["token"], result.passages)
    trace = heat.data[0]
    assert len(trace.z) == 3 and len(trace.z[0]) == len(result.variants["token"].tokens)  # (K, T)
    assert trace.colorbar.title.text == "posterior" and trace.zmin == 0 and trace.zmax == 1
    assert heat.layout.title.subtitle.text == "a column for each answer token"  # the title names the axis
    assert list(heat.layout.xaxis.ticktext) == [esc(plots.token_label(t)) for t in result.variants["token"].tokens]
    assert list(heat.layout.yaxis.ticktext) == [plots.passage_label(p, 14) for p in result.passages]  # rows name themselves
    for col in range(len(trace.z[0])):
        assert sum(row[col] for row in trace.z) == pytest.approx(1.0, abs=1e-6)
        assert [row[col] for row in trace.z] == pytest.approx(result.variants["token"].posteriors[col], abs=1e-6)

    gain = plots.retrieval_gain_figure(list(result.variants.values()))
    v = result.variants["token"]
    assert list(gain.data[0].y) == pytest.approx([a - b for a, b in zip(v.token_logprobs, v.closed_book_token_logprobs)])
    assert gain.layout.yaxis.title.text and gain.layout.title.text and len(gain.data) == 2
    assert gain.layout.yaxis.exponentformat == "none"  # no "μ" on a tiny gain

    bars = plots.doc_prob_figure(result)
    assert list(bars.data[0].x) == pytest.approx([p.prob for p in result.passages])
    assert bars.layout.xaxis.title.text == "p(z|x)"

    reports = actions.engine.index_reports(actions.engine.default_kb)
    fig = plots.index_report_figure(reports)
    assert len(fig.data) == 3 and fig.layout.title.text
    assert list(fig.data[0].text) == [f"{r.recall_at_k:.3f}" for r in reports]
    table = format_index_table(reports, actions.engine.default_kb)
    for r in reports:  # the chart and the table write each size alike
        assert plots.megabytes(r.bytes) in list(fig.data[2].text) and f"<td>{plots.megabytes(r.bytes)}</td>" in table
    # the ui engine's KB is small: the table says what a comparison on it cannot show
    assert reports[0].num_vectors < 100 and "approximate indexes have nothing to save" in table
    assert "nothing to save" not in format_index_table([replace(r, num_vectors=12_324) for r in reports], "wikipedia")
    near = [replace(reports[0], recall_at_k=0.999)]  # HNSW's 0.999 is drawn as itself, not "1.00"
    assert list(plots.index_report_figure(near).data[0].text) == ["0.999"] and "0.999" in plots.describe_index_reports(near)


# ---- Ask -----------------------------------------------------------------------------------


def test_ask_returns_every_output(actions):
    status, answer, passages, prob_fig, heat_token, heat_seq, gain, question_encoder, last = ask(actions, k=3)
    assert status == ""
    result = unwrap(last)
    assert isinstance(last, Held) and isinstance(result, AskResult)
    assert set(result.variants) == {"token", "sequence"} and result.closed_book is not None
    cards = [*result.variants.values(), result.closed_book]  # in the order the page shows them
    assert re.findall(r'<span class="rag-tok-text">(.*?)</span>', answer) == [shown(t) for c in cards for t in c.tokens]
    for v in result.variants.values():
        assert v.tokens and f"p(y|x) = <b>{fmt_prob(math.exp(v.logprob))}</b>" in answer
    assert f"p(y|x) = <b>{fmt_prob(math.exp(result.closed_book.logprob))}</b>" in answer
    assert "Closed-book" in answer and "encode" in answer and "exact search" in answer
    assert "question encoder: tiny-dpr" in answer and result.question_encoder == "tiny-dpr"
    assert question_encoder == {"__type__": "update"}  # the choice stays as the visitor left it
    assert passages.count('class="rag-passage"') == 3
    titles = re.findall(r'<span class="rag-passage-title">(.*?)</span>', passages)
    assert titles == [esc(p.title) for p in result.passages]
    assert [f"p(z|x) <b>{p.prob:.3f}</b>" in passages for p in result.passages] == [True] * 3
    assert heat_token["visible"] and heat_seq["visible"]
    assert list(prob_fig["value"].data[0].x) == pytest.approx([p.prob for p in result.passages])
    assert gain["visible"]


def test_ask_passes_every_option_to_the_engine(actions, ui_engine):
    out = ask(actions, QUESTIONS[1], variant="both", kb=KB_NAMES[1], k=4, index="hnsw", beams=2, decoding="fast")
    assert out.status == ""
    result = unwrap(out.last)
    assert (result.kb, result.k, result.index, len(result.passages)) == (KB_NAMES[1], 4, "hnsw", 4)
    assert result.variants["token"].decoding == "beam 2" and result.variants["sequence"].decoding == "beam 2, fast"
    assert "recall@4" in out.answer
    direct = ui_engine.ask(QUESTIONS[1], kb=KB_NAMES[1], k=4, index="hnsw", variants=("token", "sequence"), num_beams=2,
                           sequence_decoding="fast")
    for name in ("token", "sequence"):
        assert result.variants[name].token_ids == direct.variants[name].token_ids
        assert result.variants[name].logprob == pytest.approx(direct.variants[name].logprob, abs=1e-5)
    assert [p.id for p in result.passages] == [p.id for p in direct.passages]


def test_ask_one_variant_hides_the_other_heatmap(actions):
    out = ask(actions, variant="token")
    assert out.heat_token["visible"] is True and out.heat_seq["visible"] is False
    assert set(unwrap(out.last).variants) == {"token"}


@pytest.mark.parametrize("question", ["", "   ", None])
def test_empty_question_is_a_friendly_message(actions, question):
    out = ask(actions, question=question)
    assert "Type a question" in out[0] and "rag-status-error" in out[0]
    assert all(is_skip(v) for v in out[1:])


def test_a_question_of_marks_alone_is_refused_and_the_api_says_it_in_its_own_words(actions):
    out = ask(actions, question=" ?! ")
    assert "has no words: ask it in words" in out[0] and all(is_skip(v) for v in out[1:])
    for question, said in (("", "the question is empty; give a non-blank question"), ("?", "has no words")):
        with pytest.raises(gr.Error, match=said):
            actions.ask_json(question, "token", 2, "flat", "")


def test_bad_option_is_a_message_not_a_traceback(actions):
    out = actions.ask(QUESTION, "nonsense", 5, "flat", actions.engine.default_kb, 1, "thorough", None)
    assert "unknown variant" in out[0] and all(is_skip(v) for v in out[1:])
    out = actions.ask(QUESTION, "both", 5, "annoy", actions.engine.default_kb, 1, "thorough", None)
    assert "unknown index" in out[0] and "rag-status-error" in out[0]  # the engine's own message


def test_unexpected_engine_error_is_hidden(actions, monkeypatch):
    def broken(question, **options):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(actions.engine, "ask", broken)
    out = ask(actions)
    assert "Something went wrong" in out[0] and "secret internals" not in out[0] and "Traceback" not in out[0]


def test_kb_swap_changes_the_answer(actions, ui_engine):
    left_kb, right_kb = KB_NAMES
    status, summary, left, right, question_encoder = actions.swap(QUESTION, left_kb, right_kb, "both", 5, None)
    assert status == "" and question_encoder == {"__type__": "update"}  # the choice stays as it was
    a, b = (ui_engine.ask(QUESTION, kb=kb, k=5, variants=("token", "sequence")) for kb in KB_NAMES)
    # the same random model reads different passages: the RAG-Token answer of this question differs
    assert a.variants["token"].answer != b.variants["token"].answer
    for column, result in ((left, a), (right, b)):
        assert f"knowledge base <b>{result.kb}</b>" in column and "Closed-book" not in column  # its answer is in the summary
        assert ">nan<" not in column and "nan nats" not in column and "closed-book p" in column  # asked, for the conflicts
        for v in result.variants.values():
            assert all(f'<span class="rag-tok-text">{shown(t)}</span>' in column for t in v.tokens)
        assert column.count('class="rag-passage"') == 3
    for result in (a, b):  # with both variants, each answer is named
        said = f"RAG-Token “{esc(result.variants['token'].answer)}” / RAG-Sequence “{esc(result.variants['sequence'].answer)}”"
        assert f"<b>{result.kb}</b> → {said}" in summary
    assert esc(swap_verdict(a, b)) in summary
    assert f"closed-book, no passages → “{esc(a.closed_book.answer)}”" in summary
    same = actions.swap(QUESTION, left_kb, left_kb, "token", 5, None)[1]
    assert "read the same knowledge base" in same
    assert f"→ “{esc(a.variants['token'].answer)}” &nbsp;" in same and "RAG-Token “" not in same  # one variant: no name


def _said(kb: str, answer: str, passage_text: str) -> AskResult:
    """A one-passage, one-variant result: `answer` from `kb`, whose passage reads `passage_text`."""
    from rag_demo.results import RetrievedPassage, VariantResult

    passage = RetrievedPassage(1, 0, "", passage_text, 0.5, 1.0, 10.0)
    found = (1,) if re.search(rf"\b{re.escape(answer)}\b", passage_text, re.IGNORECASE) else ()  # as the engine's found_in
    variant = VariantResult("token", answer, (answer,), (1,), -1.0, (-1.0,), ((-1.0,),), ((1.0,),), (-2.0,), found_in=found)
    return AskResult("q", kb, "flat", 1, (passage,), {"token": variant}, None, {})


@pytest.mark.parametrize("left, right, verdict", [
    (("Paris", "Paris is the capital."), ("Lyon", "Lyon is the capital."), "each side's answer appears in the 1 passage it read"),
    (("Paris", "Paris is the capital."), ("Rome", "Lyon is the capital."), "some of it may come from the model"),
    (("Paris", "Paris is the capital."), ("Paris", "The capital is Paris ."), "it appears in the 1 passage it read on each side"),
    (("Paris", "Paris is the capital."), ("Paris", "Lyon is the capital."), "it appears only in L's passages"),
    (("Paris", "Versailles is a palace."), ("Paris", "Gare du Nord is a station."), "its words appear in neither side's passages"),
])
def test_swap_verdict_checks_the_answers_against_each_sides_passages(left, right, verdict):
    got = swap_verdict(_said("L", *left), _said("R", *right))
    assert verdict in got
    assert swap_verdict(_said("L", *left), _said("L", *right)).startswith("Both sides read the same knowledge base")


class HeardProgress:
    """Stands in for gradio's tracker: records what the page would show."""

    def __init__(self):
        self.heard: list[tuple[tuple[int, int] | None, str]] = []

    def __call__(self, fraction, desc=None, **_):
        self.heard.append((fraction, desc))


def test_examples_follow_the_knowledge_base_and_hide_for_a_visitors_own(actions):
    for name in KB_NAMES:
        update = actions.examples_update(name)
        assert update.visible and update.raw_samples == actions.examples(name) != []
    hidden = actions.examples_update(PRIVATE_KB)
    assert hidden.visible is False and hidden.raw_samples == []


def test_ask_and_swap_show_which_step_runs(actions):
    tracker = HeardProgress()
    out = actions.ask(QUESTION, "both", 3, "flat", KB_NAMES[0], 1, "thorough", None, progress=tracker)
    assert out[0] == ""
    steps = [desc for _, desc in tracker.heard]
    assert steps[0] == "retrieving passages" and steps[-1] == "the closed-book answer (no passages)"
    assert [done for (done, _), _ in tracker.heard] == list(range(len(steps)))

    tracker = HeardProgress()
    assert actions.score(QUESTION, "Paris", KB_NAMES[0], 3, "flat", None, progress=tracker)[0] == ""
    assert [desc for _, desc in tracker.heard][-1] == "scoring it closed-book (no passages)"

    tracker = HeardProgress()
    assert actions.swap(QUESTION, KB_NAMES[0], KB_NAMES[1], "token", 3, None, progress=tracker)[0] == ""
    halves = len(tracker.heard) // 2
    assert [desc for _, desc in tracker.heard[:2]] == [f"{KB_NAMES[0]}: retrieving passages", f"{KB_NAMES[0]}: reading the 3 passages"]
    assert tracker.heard[halves][1] == f"{KB_NAMES[1]}: retrieving passages"
    assert [done for (done, _), _ in tracker.heard] == list(range(2 * halves))  # one bar across both asks
    assert {total for (_, total), _ in tracker.heard} == {2 * halves}


def test_ask_json_shape(actions):
    data = actions.ask_json(QUESTION, "both", 4, "hnsw", "")
    json.dumps(data)  # plain JSON
    assert set(data) >= {"question", "kb", "index", "k", "passages", "variants", "closed_book", "timings_ms",
                         "notices", "index_recall", "scale"}
    assert data["index"] == "hnsw" and data["k"] == 4 and len(data["passages"]) == 4 and data["kb"] == KB_NAMES[0]
    assert 0 <= data["index_recall"] <= 1
    assert set(data["variants"]) == {"token", "sequence"}
    assert set(data["timings_ms"]) >= {"encode", "search", "generate", "total"}
    probs = [p["prob"] for p in data["passages"]]
    assert sum(probs) == pytest.approx(1.0, abs=1e-5)
    assert probs == pytest.approx(softmax([data["scale"] * p["score"] for p in data["passages"]]), abs=1e-5)
    for v in data["variants"].values():
        assert len(v["posteriors"]) == len(v["tokens"]) == len(v["token_logprobs"]) == len(v["doc_token_logprobs"])
        assert all(sum(row) == pytest.approx(1.0, abs=1e-4) for row in v["posteriors"])
        assert sum(v["token_logprobs"]) == pytest.approx(v["logprob"], abs=1e-4)
    assert set(actions.ask_json(QUESTION, "token")["variants"]) == {"token"}
    with pytest.raises(gr.Error, match="the question is empty; give a non-blank question"):
        actions.ask_json("  ")


@pytest.mark.parametrize("args, message", [
    ((123,), "the question must be text, got int"),
    ((QUESTION, "both", 2.7), "k must be a whole number, got '2.7'"),
    ((QUESTION, "both", True), "k must be a whole number, got 'True'"),
    ((QUESTION, "both", 2, "flat", "", "", "no"), "extractive must be true, false or empty"),
])
def test_ask_json_refuses_what_it_would_otherwise_read_as_something_else(actions, args, message):
    with pytest.raises(gr.Error, match=message):
        actions.ask_json(*args)


def test_ask_json_reads_switch_words_and_empty_as_the_default(actions):
    data = actions.ask_json(QUESTION, "", "3", "", "", "", "false")
    assert (set(data["variants"]), data["k"], data["index"], data["extractive"]) == ({"token", "sequence"}, 3, "flat", False)


def test_demo_builds_with_named_endpoints_and_one_engine_lane(ui_engine):
    demo = build_demo(ui_engine)
    endpoints = demo.get_api_info()["named_endpoints"]
    for name in ("/ask", "/ask_json", "/swap", "/score", "/score_json", "/index_reports", "/build_kb", "/edit_passage",
                 "/ask_mine", "/compare", "/compare_json"):
        assert name in endpoints
    # the memory switch came last, so that older clients' positional arguments keep their places
    assert [p["parameter_name"] for p in endpoints["/ask_json"]["parameters"]] == ["question", "variant", "k", "index", "kb",
                                                                                 "retriever", "extractive", "memory"]
    assert [p["parameter_name"] for p in endpoints["/score_json"]["parameters"]] == [
        "question", "answer", "kb", "k", "index", "variant", "retriever", "memory"]
    # and the question encoder after it, for the same reason
    for name in ("/ask", "/score", "/swap"):
        assert [p["parameter_name"] for p in endpoints[name]["parameters"]][-2:] == ["memory", "question_encoder"]
    assert [p["parameter_name"] for p in endpoints["/compare_json"]["parameters"]] == ["question", "kb", "k"]
    engine_fns = [fn for fn in demo.fns.values() if fn.concurrency_id == ENGINE_GROUP]
    assert len(engine_fns) >= 10 and all(fn.concurrency_limit == 1 for fn in engine_fns)
    assert {fn.api_name for fn in engine_fns} >= {"compare", "compare_json"}


# ---- Your knowledge ------------------------------------------------------------------------


def write(tmp_path: Path, name: str, data: bytes | str) -> str:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return str(path)


def test_upload_paste_edit_and_reask(actions, ui_engine, tmp_path):
    files = [write(tmp_path, "notes.txt", "Zorblax is the capital of Plutonia, a city of glass domes."),
             write(tmp_path, "facts.jsonl", json.dumps({"title": "Moons", "text": "Plutonia has three moons."}) + "\n")]
    out = actions.build_mine(files, "Pasted", "Quixel invented the hover bicycle in 2091.", None)
    status, mine = out.status, out.mine
    assert "rag-status-ok" in status and "Indexed 3 passages" in status
    kb = unwrap(mine)
    assert len(kb) == 3 and kb.name == PRIVATE_NAME
    expected = ui_engine.encoder.encode_passages([kb.passage(i) for i in range(3)])
    assert kb.embeddings == pytest.approx(expected, abs=1e-5)  # embedded by the engine's passage encoder
    assert out.picker["choices"][0][1] == 0 and out.edit_title == kb.titles[0]
    for menu in KB_MENUS:  # every tab's knowledge-base dropdown now offers it
        assert (PRIVATE_LABEL + ": 3 passages", PRIVATE_KB) in getattr(out, menu)["choices"]

    status, answer, passages = actions.ask_mine("What is the capital of Plutonia?", mine)
    assert status == "" and "Zorblax" in passages and passages.count('class="rag-passage"') == 3
    assert "RAG-Token" in answer and "RAG-Sequence" in answer
    assert "fitted on the packaged knowledge bases, not on this one" in answer  # why no ∅ here

    result = unwrap(ask(actions, question="What is the capital of Plutonia?", kb=PRIVATE_KB, mine=mine).last)
    assert result.kb == PRIVATE_NAME and {p.text for p in result.passages} == set(kb.texts)

    edited = actions.save_passage(0, "notes", "Glimmerton is the capital of Plutonia, a city of glass domes.", mine)
    assert "Saved passage 1" in edited.status
    new = unwrap(edited.mine)
    assert "Glimmerton" in new.texts[0] and new.texts[1:] == kb.texts[1:]
    assert new.embeddings[0] != pytest.approx(kb.embeddings[0], abs=1e-3)  # re-indexed
    assert new.embeddings[1:] == pytest.approx(kb.embeddings[1:], abs=1e-5)
    removed = actions.save_passage(2, "", "", edited.mine)
    assert "Removed passage 3" in removed.status and len(unwrap(removed.mine)) == 2


@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        ("blob.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary"),
        ("latin.txt", "caf\xe9".encode("latin-1"), "UTF-8"),
        ("paper.pdf", b"%PDF-1.4", "unsupported file type"),
        ("rows.jsonl", "{not json}\n", "not valid JSON"),
        ("rows.csv", "name,body\nx,y\n", "header row"),
        ("empty.md", b"", "empty"),
    ],
)
def test_bad_upload_is_a_message_and_the_session_goes_on(actions, tmp_path, name, data, message):
    before = Held(None)
    out = actions.build_mine([write(tmp_path, name, data)], "", "", before)
    assert message in out.status and "rag-status-error" in out.status
    assert out.mine is before and all(is_skip(v) for v in out[2:])
    ok = actions.build_mine(None, "", "Some text that is fine to index.", before)
    assert "rag-status-ok" in ok.status and len(unwrap(ok.mine)) == 1


def test_upload_limits(ui_engine, tmp_path):
    small = DemoActions(ui_engine, limits=UploadLimits(max_files=2, max_file_bytes=100, max_passages=2,
                                                             max_paste_chars=50))
    many = [write(tmp_path, f"{i}.txt", "hello") for i in range(3)]
    assert "the limit is 2" in small.build_mine(many, "", "", None)[0]
    big = write(tmp_path, "big.txt", "word " * 100)
    assert "per file" in small.build_mine([big], "", "", None)[0]
    assert "characters" in small.build_mine(None, "", "x" * 51, None)[0]
    long_text = " ".join(["w"] * 300)
    assert "limit" in DemoActions(ui_engine, limits=UploadLimits(max_passages=2)).build_mine(None, "", long_text, None)[0]
    assert "Nothing to index" in small.build_mine(None, "", "   ", None)[0]
    assert "limits" not in UploadLimits().describe() and "2 MB" in UploadLimits().describe()


def test_evil_passage_is_escaped_end_to_end(actions):
    out = actions.build_mine(None, EVIL_TITLE, EVIL_TEXT, None)
    assert "rag-status-ok" in out.status
    assert_no_raw_html(out.preview)
    status, answer, passages = actions.ask_mine("Where does the evil passage live?", out.mine)
    assert status == ""
    assert_no_raw_html(answer)
    assert_no_raw_html(passages)
    assert "&lt;script&gt;" in passages
    heat = ask(actions, question="Where does the evil passage live?", kb=PRIVATE_KB, mine=out.mine).heat_token["value"]
    assert "<img" not in json.dumps(heat.to_plotly_json(), default=str)


def test_private_kb_needs_building_first(actions):
    out = ask(actions, kb=PRIVATE_KB, mine=None)
    assert "Build your knowledge base first" in out[0]
    assert "Build your knowledge base first" in actions.ask_mine("q?", None)[0]
    assert "Build your knowledge base first" in actions.save_passage(0, "t", "x", None)[0]
    # a review saw that message stay under the ask box after a build that succeeded
    built = actions.build_mine(None, "", "Zorblax is the capital of Plutonia.", None)
    assert "rag-status-ok" in built.status and built.ask_status == ""
    assert not isinstance(actions.build_mine(None, "", "  ", built.mine).ask_status, str)  # a failed build leaves it


# ---- Score, index variants, Learn ----------------------------------------------------------


def test_score_your_answer(actions, ui_engine):
    status, markup, heat_token, heat_seq, gain, question_encoder = actions.score(QUESTION, "Paris", actions.engine.default_kb,
                                                                                3, "flat", None)
    assert question_encoder == {"__type__": "update"}  # the choice stays as it was
    assert status == "" and "closed-book log p" in markup and "RAG-Token" in markup and "RAG-Sequence" in markup
    assert heat_token["visible"] and heat_seq["visible"]
    direct = ui_engine.score(QUESTION, "Paris", kb=ui_engine.default_kb, k=3)
    for v in direct.variants.values():
        assert f"log {fmt_log(v.logprob)}" in markup
        assert f"<b>{fmt_signed(v.logprob - sum(v.closed_book_token_logprobs))}</b> nats" in markup
    assert "Type an answer" in actions.score(QUESTION, "  ", actions.engine.default_kb, 3, "flat", None)[0]
    # the Score tab has no examples to click: its message does not point to any
    said = actions.score("", "Paris", actions.engine.default_kb, 3, "flat", None)[0]
    assert "Type a question first." in said and "example" not in said
    assert "Type a question" in actions.score("", "Paris", actions.engine.default_kb, 3, "flat", None)[0]
    assert "Type a question and the answer" in actions.score(" ", "", actions.engine.default_kb, 3, "flat", None)[0]
    # the question's box comes first on the page, and so does its message: a review got "Type an answer" first
    assert "Type a question first." in actions.score("", "?", actions.engine.default_kb, 3, "flat", None)[0]


def test_index_reports(actions, ui_engine):
    status, table, fig = actions.index_reports(actions.engine.default_kb, None)
    assert status == "" and table.count("<tr>") == 4  # header + flat, hnsw, ivfpq
    assert "recall@" in table and fig["visible"] and len(fig["value"].data) == 3
    for report in ui_engine.index_reports(ui_engine.default_kb):
        assert f"<td><b>{report.kind}</b></td>" in table and f"<td>{report.recall_at_k:.3f}</td>" in table
        assert f"<td>{report.num_vectors:,}</td>" in table
    assert report.num_vectors == len(ui_engine.kbs[ui_engine.default_kb])


def test_learn_events(actions):
    last = ask(actions).last
    tokens = unwrap(last).variants["token"].tokens
    picker, markup = actions.learn_tokens(last)
    assert picker["value"] == 0 and len(picker["choices"]) == len(tokens) and picker["visible"] is True
    assert actions.learn_tokens(None).token_picker["visible"] is False  # no answer yet: no empty menu
    assert "RAG-Token" in markup and "RAG-Sequence" in markup
    assert f"Token {len(tokens)} of the answer" in actions.learn(last, len(tokens) - 1)
    token_only = ask(actions, variant="token").last
    assert "Ask with RAG-Sequence" in actions.learn(token_only, 0)


# ---- first start ---------------------------------------------------------------------------


def test_background_engine_reports_progress_then_serves(ui_engine):
    gate = []

    def factory(progress):
        progress("downloading models", 1, 3)
        while not gate:
            time.sleep(0.01)
        return ui_engine

    engine = BackgroundEngine(factory).start()
    actions = DemoActions(engine)
    time.sleep(0.05)
    assert not engine.ready and "downloading models (1/3" in engine.status_text()
    banner, timer, announced, *rest = actions.poll(0)
    assert "downloading models" in banner and announced == 0 and all(is_skip(v) for v in rest)
    out = ask(actions, kb=KB_NAMES[0])
    assert "Preparing" in out[0] and "rag-status-wait" in out[0]
    demo = build_demo(engine)  # builds while not ready
    assert demo is not None
    gate.append(True)
    assert engine.wait(5)
    ready = actions.poll(0)
    assert ready.banner == "" and ready.announced == 1
    assert ready.kb["value"] == engine.default_kb and (KB_NAMES[0], KB_NAMES[0]) in ready.kb["choices"]
    assert ready.swap_right["value"] == KB_NAMES[1]  # the swap tab's right side starts on the other knowledge base
    assert ready.examples.raw_samples == [[q] for q in QUESTIONS]  # the engine's example questions
    # an engine without a lexical weight: dense and BM25 to choose from, once it is ready
    assert ready.retriever == {"__type__": "update", "choices": [("Dense (the paper)", "dense"), ("BM25", "bm25")],
                               "value": "dense", "visible": True}
    assert ask(actions)[0] == ""
    assert all(is_skip(v) for v in actions.poll(1)[3:])


def test_a_staged_start_answers_early_and_swaps_in_each_better_engine(ui_engine):
    """A first start in stages: the first engine answers while the rest builds, each answer says
    which parts gave it, an ask in flight finishes on the engine it began on, and the page keeps
    the visitor's choices when a better engine arrives (only the examples change)."""
    gates = [threading.Event(), threading.Event()]
    started_asking, finish_ask = threading.Event(), threading.Event()
    slow_engine = SimpleNamespace(**{name: getattr(ui_engine, name) for name in
                                     ("kb_names", "default_kb", "lexical_weight", "retrievers", "example_questions",
                                      "memory_logit", "release_kb")})

    def slow_ask(question, **options):
        started_asking.set()
        finish_ask.wait(10)
        return ui_engine.ask(question, **options)

    slow_engine.ask = slow_ask

    def factory(progress):
        progress("embedding passages", 0, 10)
        yield Stage(slow_engine, "BM25 retrieval and the base generator", "dense vectors are building (2 of 4)")
        gates[0].wait(10)
        yield Stage(ui_engine, "dense retrieval and the reading adapter")

    engine = BackgroundEngine(factory).start()
    actions = DemoActions(engine)
    deadline = time.monotonic() + 5
    while not engine.ready and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.ready and not engine.complete and engine.engines_served == 1
    first = actions.poll(0)
    assert "Answering now with BM25 retrieval and the base generator" in first.banner
    assert "dense vectors are building (2 of 4)" in first.banner and "embedding passages (0/10" in first.banner
    assert first.timer.active is True and first.announced == 1 and first.kb["value"] == KB_NAMES[0]
    status = engine.status()
    assert (status["ready"], status["complete"], status["engines_served"]) == (True, False, 1)
    assert status["building"] == "dense vectors are building (2 of 4)"
    answers = []
    asking = threading.Thread(target=lambda: answers.append(engine.ask(QUESTION, kb=KB_NAMES[0], k=2)))
    asking.start()
    assert started_asking.wait(5)
    gates[0].set()  # the complete engine arrives while that ask is still running
    assert engine.wait(5) and engine.complete and engine.engines_served == 2
    finish_ask.set()
    asking.join(10)
    assert answers and any("answered with BM25 retrieval and the base generator" in n for n in answers[0].notices)
    later = engine.ask(QUESTION, kb=KB_NAMES[0], k=2)
    assert not any("answered with" in n for n in later.notices)
    swapped = actions.poll(1)
    assert swapped.banner == "" and swapped.timer.active is False and swapped.announced == 2
    assert is_skip(swapped.kb) and is_skip(swapped.retriever)  # the visitor's choices stay
    assert swapped.examples.raw_samples == [[q] for q in QUESTIONS]
    assert engine.status()["complete"] is True and engine.status_text() == "ready"


def test_the_build_steps_aside_while_a_visitor_is_answered(ui_engine):
    """Between two batches the build waits for an ask in flight, so the two do not share the cores;
    with nobody asking it does not wait at all."""
    asking, finish_ask, events = threading.Event(), threading.Event(), []
    slow_engine = SimpleNamespace(**{name: getattr(ui_engine, name) for name in
                                     ("kb_names", "default_kb", "lexical_weight", "retrievers", "example_questions",
                                      "memory_logit", "release_kb")})

    def slow_ask(question, **options):
        asking.set()
        finish_ask.wait(10)
        events.append("ask done")
        return ui_engine.ask(question, **options)

    slow_engine.ask = slow_ask

    def factory(progress):
        yield Stage(slow_engine, "BM25 retrieval", "dense vectors are building (2 of 4)")
        started = time.monotonic()
        progress("embedding passages", 1, 3)  # nobody asks: no wait
        events.append(("first batch reported", time.monotonic() - started))
        assert asking.wait(5)
        progress("embedding passages", 2, 3)  # an ask is in flight: waits for it
        events.append("second batch reported")
        yield Stage(ui_engine, "dense retrieval")

    engine = BackgroundEngine(factory)
    engine.answering._began -= 60  # as if the build had run a minute: its waits are bounded by that
    engine.start()
    deadline = time.monotonic() + 5
    while not engine.ready and time.monotonic() < deadline:
        time.sleep(0.01)
    threading.Thread(target=lambda: engine.ask(QUESTION, kb=KB_NAMES[0], k=2), daemon=True).start()
    assert asking.wait(5)
    time.sleep(0.3)
    assert "second batch reported" not in events and engine.answering.calls == 1
    finish_ask.set()
    assert engine.wait(5) and engine.complete
    assert events[0][0] == "first batch reported" and events[0][1] < 0.1
    assert events[1:] == ["ask done", "second batch reported"]


def test_stepping_aside_is_bounded_by_the_time_the_build_has_run():
    """Waits add up to no more than the time the build ran, and none is longer than LONGEST_PAUSE_S."""
    answering = Answering()
    assert answering.step_aside() == 0.0  # nobody asks
    with answering:  # an ask that outlasts every bound
        answering._began = time.monotonic() - 0.4
        first = answering.step_aside()
        assert 0.3 < first < 0.6  # it had run 0.4 s, so it waited about 0.4 s
        assert answering.step_aside() < 0.05  # waited as long as it ran: no more until it runs again
    assert answering.calls == 0


def test_a_failure_after_the_first_engine_keeps_it_serving_and_says_so(ui_engine):
    def factory(progress):
        yield Stage(ui_engine, "BM25 retrieval and the base generator", "dense vectors are building (2 of 4)")
        raise InputError("no space left under /cache; free some or set RAG_DEMO_CACHE")

    engine = BackgroundEngine(factory).start()
    assert not engine.wait(5) and engine.ready and not engine.failed
    assert "building the rest failed" in engine.status_text() and "/cache" in engine.status_text()
    notices = engine.ask(QUESTION, kb=KB_NAMES[0], k=2).notices
    assert any("answered with BM25 retrieval and the base generator" in n for n in notices)
    assert engine.status()["error"].startswith("no space left")


def test_background_engine_failure_is_shown():
    def factory(progress):
        raise InputError("model folder /nope is missing; set RAG_DEMO_CACHE")

    engine = BackgroundEngine(factory).start()
    assert not engine.wait(5) and engine.failed
    banner = DemoActions(engine).poll(False)[0]
    assert "could not start" in banner and "/nope" in banner and "rag-status-error" in banner
    with pytest.raises(RagDemoError):
        engine.ask(QUESTION, kb=KB_NAMES[0])


def test_passages_from_inputs_pasted_title_default():
    passages = passages_from_inputs(None, "", "one two three")
    assert passages == [Passage("Pasted text", "one two three")]
    with pytest.raises(InputError):
        passages_from_inputs(None, None, None)


def test_pasted_paragraphs_and_a_text_files_paragraphs_are_passages_of_their_own(tmp_path):
    """A review pasted three short paragraphs on three things and got "Indexed 1 passage": every ask then gave
    p(z|x) 1.000 and warned that no passage was close. Paragraphs are passages; a heading joins its paragraph."""
    text = ("Garden\n\nThe school garden was planted in April by the third-grade class.\r\n\r\n"
            "The garden is watered every Tuesday and Friday by volunteers.\n \nOur class pet is a tortoise named Biscuit.")
    pasted = passages_from_inputs(None, "Class notes", text)
    assert [p.text for p in pasted] == ["Garden The school garden was planted in April by the third-grade class.",
                                        "The garden is watered every Tuesday and Friday by volunteers.",
                                        "Our class pet is a tortoise named Biscuit."]
    notes = tmp_path / "notes.txt"
    notes.write_text(text, encoding="utf-8")
    assert [p.text for p in passages_from_inputs([str(notes)], "", "")] == [p.text for p in pasted]
    rows = tmp_path / "rows.csv"
    rows.write_text('title,text\nA,"' + text.replace("\r", "") + '"\n', encoding="utf-8")
    assert len(passages_from_inputs([str(rows)], "", "")) == 1  # a row is one unit of text, cut by length alone


def test_k_is_fitted_to_a_small_private_kb(actions):
    mine = actions.build_mine(None, "", "Zorblax is the capital of Plutonia.", None)[1]
    out = ask(actions, question="What is the capital of Plutonia?", kb=PRIVATE_KB, mine=mine, k=5)
    result = unwrap(out.last)
    assert result.k == 1 and len(result.passages) == 1 and result.passages[0].prob == pytest.approx(1.0)
    # a review read "#1" on an answer whose note said no passage backs it: with one source the legend says why
    assert "With one source, every token's posterior is all on it" in out.answer
    wider = ask(actions, question="What is the capital of Plutonia?", k=2)
    assert "With one source" not in wider.answer and "Token colour" in wider.answer


# ---- app.py --------------------------------------------------------------------------------


def test_app_server_options_and_lazy_engine(ui_engine):
    import app

    assert app.server_options({}) == {"server_name": "127.0.0.1", "server_port": None}
    assert app.server_options({"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "9000"}) == {
        "server_name": "0.0.0.0", "server_port": 9000}
    seen = []

    def factory(progress):
        progress("loading", 1, 1)
        seen.append(True)
        return ui_engine

    demo = app.create_demo(factory)
    assert isinstance(demo, gr.Blocks)
    for _ in range(100):
        if seen:
            break
        time.sleep(0.02)
    assert seen


# ---- hybrid retrieval --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hybrid_actions(ui_engine):
    from dataclasses import replace

    from rag_demo.config import RetrievalConfig
    from rag_demo.engine import RagEngine

    engine = RagEngine(encoder=ui_engine.encoder, generator=ui_engine.generator, kbs=ui_engine.kbs,
                       config=replace(ui_engine.config, retrieval=RetrievalConfig(lexical_weight=0.5)))
    return DemoActions(engine)


def test_retriever_radio_offers_hybrid_only_for_an_engine_with_a_lexical_weight(actions, hybrid_actions):
    assert actions.retriever_options() == {"choices": [("Dense (the paper)", "dense"), ("BM25", "bm25")], "value": "dense",
                                           "visible": True}
    assert hybrid_actions.retriever_options() == {
        "choices": [("Dense (the paper)", "dense"), ("BM25", "bm25"), ("Dense + BM25", "hybrid")], "value": "hybrid",
        "visible": True}
    assert DemoActions(BackgroundEngine(lambda progress: None)).retriever_options()["visible"] is False  # not started


def test_hybrid_ask_shows_bm25_and_its_formula(hybrid_actions):
    status, answer, passages, prob_fig, *_, last = ask(hybrid_actions, k=3, retriever="hybrid")
    assert status == ""
    result = unwrap(last)
    assert (result.retriever, result.lexical_weight) == ("hybrid", 0.5)
    assert [f"bm25 {p.lexical:.2f}" in passages for p in result.passages] == [True] * 3
    assert "dense + BM25" in answer
    assert "+ 0.5·bm25" in prob_fig["value"].layout.title.text
    prior = softmax([result.scale * p.score + 0.5 * p.lexical for p in result.passages])
    assert prior == pytest.approx([p.prob for p in result.passages], abs=1e-5)
    learn = format_learn_html(result, 0)
    assert "β = 0.5" in learn and f"<b>{prior[0]:.4f}</b>" in learn and f"<td>{result.passages[0].lexical:.3f}</td>" in learn

    status, answer, passages, *_, last = ask(hybrid_actions, k=3, retriever="dense")
    result = unwrap(last)
    assert status == "" and result.retriever == "dense" and "bm25" not in passages and "dense + BM25" not in answer
    assert "β" not in format_learn_html(result, 0)


def test_retriever_choice_errors_are_messages(actions, hybrid_actions):
    assert "lexical weight" in ask(actions, retriever="hybrid")[0]
    assert "unknown retriever" in ask(hybrid_actions, retriever="<b>sparse</b>")[0]
    assert hybrid_actions.ask_json(QUESTION, "token", 2, "flat", "", "dense")["retriever"] == "dense"
    assert hybrid_actions.ask_json(QUESTION, "token", 2)["retriever"] == "hybrid"
    assert actions.ask_json(QUESTION, "token", 2, "flat", "", "bm25")["retriever"] == "bm25"  # no lexical weight needed
    with pytest.raises(gr.Error, match="unknown retriever"):
        hybrid_actions.ask_json(QUESTION, "token", 2, "flat", "", "sparse")


@pytest.mark.parametrize("beams", [1, 2])
def test_extractive_answers_copy_a_run_of_a_retrieved_passage(actions, ui_engine, beams):
    status, answer, *_, last = ask(actions, k=3, beams=beams, extractive=True)
    assert status == ""
    result = unwrap(last)
    assert result.extractive and "copying" in answer
    gen = ui_engine.generator
    sources = [gen.copy_source(result.question, Passage(p.title, p.text)) for p in result.passages]
    for variant in result.variants.values():
        assert "copying" in variant.decoding
        ids = [t for t in variant.token_ids if t not in gen.stop_ids]
        assert ids, variant
        assert any(src[i : i + len(ids)] == ids for src in sources for i in range(len(src)))
    free = unwrap(ask(actions, k=3, beams=beams).last)
    assert not free.extractive and all("copying" not in v.decoding for v in free.variants.values())


def test_score_tab_takes_the_last_question_unless_one_was_typed_there():
    result = Held(evil_result())
    asked = result.value.question
    assert DemoActions.carry_question(result, "", "") == (asked, asked)
    assert DemoActions.carry_question(result, "  ", "") == (asked, asked)
    assert DemoActions.carry_question(result, "an earlier question", "an earlier question") == (asked, asked)
    assert all(map(is_skip, DemoActions.carry_question(result, "my own question", "")))  # never overwrite what was typed
    assert all(map(is_skip, DemoActions.carry_question(result, "my own question", "an earlier question")))
    assert all(map(is_skip, DemoActions.carry_question(None, "", "")))


def test_hybrid_passage_list_says_what_orders_it():
    passages = evil_result().passages
    assert "ranked by p(z|x)" in format_passages_html(passages, retriever="hybrid")
    assert "ranked by" not in format_passages_html(passages, retriever="dense")  # dense: the score gives the order
    assert "ranked by" not in format_passages_html(passages, retriever="bm25")  # bm25: so does its score
    assert "ranked by" not in format_passages_html(passages[:1], retriever="hybrid")


@pytest.mark.parametrize("retriever, names", [("dense", ["score 0.900"]), ("bm25", ["bm25 7.25"]),
                                              ("hybrid", ["score 0.900", "bm25 7.25"])])
def test_passage_cards_name_the_scores_their_retriever_used(retriever, names):
    from dataclasses import replace

    passages = [replace(evil_result().passages[0], lexical=7.25)]
    html = format_passages_html(passages, retriever=retriever)
    shown_names = re.findall(r"(score [0-9.]+|bm25 [0-9.]+)", html)
    assert shown_names == names


def test_bm25_ask_shows_bm25_its_scale_and_no_index(actions):
    from rag_demo.config import BM25_SCALE

    status, answer, passages, prob_fig, *_, last = ask(actions, k=3, index="hnsw", retriever="bm25")
    result = unwrap(last)
    assert status == "" and (result.retriever, result.scale) == ("bm25", BM25_SCALE)
    assert [f"bm25 {p.lexical:.2f}" in passages for p in result.passages] == [True] * 3 and "score " not in passages
    assert "exact search · no index" in answer and ">BM25</span>" in answer and "index hnsw" not in answer
    assert "was not used" in answer  # the notice says the chosen index did nothing
    assert f"softmax({BM25_SCALE:g}·bm25)" in prob_fig["value"].layout.title.text
    prior = softmax([BM25_SCALE * p.lexical for p in result.passages])
    assert prior == pytest.approx([p.prob for p in result.passages], abs=1e-6)
    learn = format_learn_html(result, 0)
    assert f"λ = {BM25_SCALE:g}" in learn and "BM25 word matching alone" in learn and "<th>bm25 b(z)</th>" in learn
    assert f"<b>{prior[0]:.4f}</b>" in learn and "β" not in learn
    data = actions.ask_json(QUESTION, "token", 3, "flat", "", "bm25")
    assert data["scale"] == BM25_SCALE and [p["logit"] for p in data["passages"]] == pytest.approx(
        [BM25_SCALE * p["score"] for p in data["passages"]], abs=1e-6)


def _comparison(gold_ids=(0,)):
    """A hand-made comparison with hostile strings: dense finds passage 0 first, bm25 only passage 1."""
    from dataclasses import replace

    from rag_demo.results import RetrieverComparison, RetrieverRanking

    first, second = evil_result().passages
    bm25_passage = replace(second, rank=1, prob=1.0, score=3.5, lexical=3.5, logit=0.7)
    rankings = (RetrieverRanking("dense", (first, second), 1.0, gold_rank=1 if 0 in gold_ids else None),
                RetrieverRanking("bm25", (bm25_passage,), 0.2, notices=("<img src=x onerror=alert(5)>",)))
    return RetrieverComparison(question="<script>q</script>?", kb="<kb>", k=2, rankings=rankings, gold_ids=tuple(gold_ids),
                               timings_ms={"dense": 1.0, "bm25": 0.5, "total": 1.5}, notices=("<b>x</b>",))


def test_comparison_html_escapes_everything_and_marks_the_gold_passage():
    html = format_comparison_html(_comparison())
    assert_no_raw_html(html)
    assert "&lt;script&gt;q&lt;/script&gt;?" in html and "&lt;kb&gt;" in html
    assert "&lt;img src=x onerror=alert(5)&gt;" in html and "&lt;b&gt;x&lt;/b&gt;" in html  # both kinds of notice
    columns = html.split('class="rag-compare-col"')[1:]
    assert len(columns) == 2 and "Dense (the paper)" in columns[0] and "BM25" in columns[1]
    assert html.count('class="rag-gold"') == 2  # in the summary, and on passage 0 in the dense column
    assert 'rag-passage rag-passage-gold' in columns[0] and "rag-passage-gold" not in columns[1]
    assert "Dense (the paper) <b>rank 1</b> · BM25 <b>not in the top 2</b>" in html
    assert "softmax(1·score)" in columns[0] and "softmax(0.2·bm25)" in columns[1] and "bm25 3.50" in columns[1]
    unknown = format_comparison_html(_comparison(gold_ids=()))
    assert "No gold passage is known" in unknown and 'class="rag-gold"' not in unknown and "gold:" not in unknown


@pytest.fixture(scope="module")
def gold_actions(ui_engine, tmp_path_factory):
    """The UI over nq-wiki stored with a questions.jsonl, as the default KBs are: the first question's gold is row 0."""
    from rag_demo.retrieval.corpus import load_kb, save_kb
    from rag_demo.questions import QUESTIONS_FILE
    from rag_demo.engine import RagEngine

    folder = save_kb(ui_engine.kbs[KB_NAMES[0]], tmp_path_factory.mktemp("gold") / KB_NAMES[0])
    row = {"question": QUESTIONS[0], "answer": "Paris", "swapped_answer": "Lyon", "passage_answer": "Paris", "gold_id": 0}
    (folder / QUESTIONS_FILE).write_text(json.dumps(row) + "\n")
    kbs = {KB_NAMES[0]: load_kb(folder, name=KB_NAMES[0])}
    return DemoActions(RagEngine(encoder=ui_engine.encoder, generator=ui_engine.generator, kbs=kbs, config=ui_engine.config))


def test_compare_event_and_api_show_what_the_engine_compared(gold_actions):
    engine = gold_actions.engine
    status, html = gold_actions.compare(QUESTION, KB_NAMES[0], 3, None)
    expected = engine.compare_retrievers(QUESTION, kb=KB_NAMES[0], k=3)
    assert status == "" and expected.gold_ids == (0,)
    columns = html.split('class="rag-compare-col"')[1:]
    assert len(columns) == len(expected.rankings) == 2
    for column, ranking in zip(columns, expected.rankings):
        assert re.findall(r"p\(z\|x\) <b>([0-9.]+)</b>", column) == [f"{p.prob:.3f}" for p in ranking.passages]
        assert ("rag-passage-gold" in column) == (ranking.gold_rank is not None)
    data = gold_actions.compare_json(QUESTION.upper(), "", 3)  # another case: the same question
    json.dumps(data)
    assert list(data["gold_ids"]) == [0] and data["kb"] == KB_NAMES[0] and data["k"] == 3
    assert [r["retriever"] for r in data["rankings"]] == ["dense", "bm25"]
    for got, want in zip(data["rankings"], expected.rankings):
        assert [p["id"] for p in got["passages"]] == [p.id for p in want.passages]
        assert [p["prob"] for p in got["passages"]] == pytest.approx([p.prob for p in want.passages], abs=1e-6)
        assert got["gold_rank"] == want.gold_rank and got["scale"] == want.scale


def test_compare_json_gives_each_retrievers_memory_share_as_an_ask_would(ui_engine):
    from tests.ui_engine import with_memory

    theta = 0.7
    engine = with_memory(ui_engine, theta)
    data = DemoActions(engine).compare_json(QUESTION, KB_NAMES[0], 3)
    for ranking in data["rankings"]:
        logits = [p["logit"] for p in ranking["passages"]]
        assert ranking["memory_logit"] == pytest.approx(theta)
        assert ranking["memory_prob"] == pytest.approx(math.exp(theta) / (math.exp(theta) + sum(map(math.exp, logits))))
    asked = engine.ask(QUESTION, kb=KB_NAMES[0], k=3, variants=("token",), closed_book=False, retriever=data["rankings"][0]["retriever"])
    assert asked.memory_prob == pytest.approx(data["rankings"][0]["memory_prob"], abs=1e-6)
    assert all(r["memory_prob"] is None for r in DemoActions(ui_engine).compare_json(QUESTION, KB_NAMES[0], 3)["rankings"])


def test_compare_errors_are_messages(actions):
    assert "Type a question" in actions.compare("  ", KB_NAMES[0], 3, None)[0]
    assert "Build your knowledge base first" in actions.compare(QUESTION, PRIVATE_KB, 3, None)[0]
    with pytest.raises(gr.Error, match="unknown knowledge base"):
        actions.compare_json(QUESTION, "<b>nope</b>", 3)
    with pytest.raises(gr.Error, match="k must be between"):
        actions.compare_json(QUESTION, "", 0)


def test_importing_the_page_module_loads_no_model_library():
    import subprocess
    import sys

    code = "import sys, rag_demo.ui.page; print(sorted(m for m in ('torch', 'transformers', 'faiss') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.stdout.strip() == "[]"


def test_only_the_events_and_the_layout_import_gradio():
    import subprocess
    import sys

    import rag_demo.ui

    code = ("import sys; sys.modules['gradio'] = None  # any import of gradio now fails\n"
            "import rag_demo.serving.background, rag_demo.text, rag_demo.ui, rag_demo.ui.html, rag_demo.ui.inputs, rag_demo.ui.learn")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert rag_demo.ui.__all__ == ["build_demo", "launch_options"]
    assert not hasattr(rag_demo.ui, "DemoActions") and not hasattr(rag_demo.ui, "format_answer_html")


# ---- limits ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big(ui_engine):
    """The UI engine's models over one knowledge base with a passage more than the largest k."""
    from rag_demo.retrieval.corpus import make_kb
    from rag_demo.engine import RagEngine

    passages = [Passage(f"Fact {i}", f"The capital of France is Paris, fact number {i} says.") for i in range(LIMITS.max_k + 1)]
    kb = make_kb("big", passages, ui_engine.encoder.encode_passages(passages), encoder=ui_engine.encoder.name)
    return RagEngine(encoder=ui_engine.encoder, generator=ui_engine.generator, kbs={"big": kb}, config=ui_engine.config)


def test_the_api_takes_the_largest_k_and_refuses_one_more(big):
    actions = DemoActions(big)
    assert len(actions.ask_json(QUESTION, "token", LIMITS.max_k, "flat", "big")["passages"]) == LIMITS.max_k
    assert actions.compare_json(QUESTION, "big", LIMITS.max_k)["k"] == LIMITS.max_k
    refused = f"k must be between 1 and {LIMITS.max_k}"
    with pytest.raises(gr.Error, match=refused):
        actions.ask_json(QUESTION, "token", LIMITS.max_k + 1, "flat", "big")
    with pytest.raises(gr.Error, match=refused):
        actions.compare_json(QUESTION, "big", LIMITS.max_k + 1)
    out = actions.ask(QUESTION, "token", LIMITS.max_k + 1, "flat", "big", 1, "thorough", None)  # the /ask endpoint
    assert refused in out.status and "rag-status-error" in out.status
    with pytest.raises(InputError, match=refused):  # the engine's own check, for callers other than the page
        big.ask(QUESTION, kb="big", k=LIMITS.max_k + 1)


def test_the_api_takes_the_most_beams_and_refuses_one_more(big):
    actions = DemoActions(big)
    out = actions.ask(QUESTION, "token", 2, "flat", "big", LIMITS.max_beams, "thorough", None)
    assert out.status == "" and unwrap(out.last).variants["token"].decoding == f"beam {LIMITS.max_beams}"
    out = actions.ask(QUESTION, "token", 2, "flat", "big", LIMITS.max_beams + 1, "thorough", None)
    assert f"beams must be between 1 and {LIMITS.max_beams}" in out.status and "rag-status-error" in out.status
    with pytest.raises(InputError, match=f"num_beams must be between 1 and {LIMITS.max_beams}"):
        big.ask(QUESTION, kb="big", num_beams=LIMITS.max_beams + 1)


def test_the_api_takes_the_longest_question_and_refuses_one_char_more(big):
    actions = DemoActions(big)
    longest = ("What is the capital of France? " * LIMITS.max_input_chars)[:LIMITS.max_input_chars - 1] + "?"
    result = actions.ask_json(longest, "token", 2, "flat", "big")
    assert f"the question was cut to its last {LIMITS.max_question_chars:,} characters" in result["notices"]
    refused = f"the question has {LIMITS.max_input_chars + 1:,} characters; the limit is {LIMITS.max_input_chars:,}"
    with pytest.raises(gr.Error, match=refused):
        actions.ask_json(longest + "?", "token", 2, "flat", "big")
    with pytest.raises(gr.Error, match=refused):
        actions.compare_json(longest + "?", "big", 2)
    assert refused in actions.ask(longest + "?", "token", 2, "flat", "big", 1, "thorough", None).status


def test_the_page_controls_stop_at_the_limits(ui_engine):
    by_id = {block.elem_id: block for block in build_demo(ui_engine).blocks.values() if getattr(block, "elem_id", None)}
    assert [by_id[name].maximum for name in ("k", "swap-k", "score-k")] == [LIMITS.max_k] * 3
    assert by_id["beams"].maximum == LIMITS.max_beams
    # a question box cuts nothing: the browser would cut a paste's end, where its question is
    assert [by_id[name].max_length for name in ("question", "swap-question", "mine-question", "score-question")] == [
        None] * 4
    assert by_id["score-answer"].max_length == LIMITS.max_answer_chars + 1


def test_passage_cards_show_the_readers_no_answer_verdict_when_there_is_one():
    passages = evil_result().passages
    shown = format_passages_html(passages, no_answer=[0.97, 0.012][:len(passages)])
    assert re.findall(r"p\(no answer\) <b>([0-9.]+)</b>", shown) == ["0.97", "0.01"][:len(passages)]
    assert "no answer" not in format_passages_html(passages)  # a generator without the marker: nothing to show
    assert "no answer" not in format_passages_html(passages, no_answer=[0.5] * (len(passages) + 1))  # not one per passage


def test_a_token_of_spaces_alone_shows_as_a_faint_mark_not_an_empty_chip():
    passage = RetrievedPassage(1, 0, "Spider", "Spiders have eight limbs.", 0.5, 1.0, 10.0)
    tokens = (" ", "8", "\n\n")
    variant = VariantResult("token", "8", tokens, (1, 2, 3), -1.0, (-0.3,) * 3, ((-0.3,),) * 3, ((1.0,),) * 3, (-1.0,) * 3)
    spans = format_token_spans(variant, (passage,))
    texts = re.findall(r'<span class="rag-tok-text">(.*?)</span>(?=<span class="rag-tok-src"|<span class="rag-tip")', spans)
    assert texts == ['<span class="rag-tok-space">␣</span>', "8", "↵↵"]


def test_the_hypotheses_line_marks_a_repeated_text_and_says_why_in_its_title():
    passage = RetrievedPassage(1, 0, "Fire", "The fire of 1666.", 0.5, 1.0, 10.0)
    variant = VariantResult("sequence", "1666", ("1666",), (1,), -1.0, (-1.0,), ((-1.0,),), ((1.0,),), (-1.0,),
                            candidates=(("1666", -1.0), ("1666", -2.0), ("1840", -3.0)))
    result = AskResult("q", "kb", "flat", 1, (passage,), {"sequence": variant}, None, {})
    line = re.search(r'<div class="rag-cands"[^>]*>.*?</div>', format_answer_html(result)).group(0)
    assert "title=" in line and "its own hypothesis" in html.unescape(line)
    assert line.count("(same words, other tokens)") == 1
    assert f"“1666” {fmt_prob(math.exp(-1.0))}, “1666” (same words, other tokens) {fmt_prob(math.exp(-2.0))}" in line


def test_the_hypotheses_line_marks_a_hypothesis_that_restates_the_question():
    passage = RetrievedPassage(1, 0, "Observatory", "The observatory's cat is called Nebula.", 0.5, 1.0, 10.0)
    variant = VariantResult("sequence", "Nebula", ("Nebula",), (1,), -1.0, (-1.0,), ((-1.0,),), ((1.0,),), (-1.0,),
                            candidates=(("Nebula", -1.0), ("the cat", -2.0)))
    result = AskResult("what is the name of the observatory's cat?", "kb", "flat", 1, (passage,), {"sequence": variant},
                       None, {})
    line = re.search(r'<div class="rag-cands"[^>]*>.*?</div>', format_answer_html(result)).group(0)
    assert f"“Nebula” {fmt_prob(math.exp(-1.0))}, “the cat” (restates the question) {fmt_prob(math.exp(-2.0))}" in line


def test_a_passage_that_starts_mid_sentence_is_shown_as_continued():
    passages = (RetrievedPassage(1, 0, "The Night Watch", "into a compelling drama of light.", 0.5, 0.6, 10.0),
                RetrievedPassage(2, 1, "The Night Watch", "The Night Watch is a painting.", 0.4, 0.4, 9.0))
    texts = re.findall(r'<div class="rag-passage-text">(.*?)</div>', format_passages_html(passages))
    assert texts == ["… into a compelling drama of light.", "The Night Watch is a painting."]


def test_a_passage_card_says_which_part_of_its_article_it_is():
    passages = (RetrievedPassage(1, 7, "Millipede", "Millipedes are arthropods.", 0.5, 0.6, 10.0, part=2, parts=3),
                RetrievedPassage(2, 9, "Centipede", "Centipedes are fast.", 0.4, 0.4, 9.0))
    cards = format_passages_html(passages).split('<div class="rag-passage" style')[1:]
    assert '<span class="rag-part"' in cards[0] and ">part 2 of 3</span>" in cards[0]
    assert "rag-part" not in cards[1]  # a passage of its own says nothing
