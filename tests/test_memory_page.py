"""The generator's memory ∅ as a source, where a visitor looks: the Ask tab's heatmaps, p(z|x) chart,
passage cards and token colours, the switch, Swap's knowledge conflicts, Score, Learn and the JSON API.

The page runs on tests/ui_engine.py's tiny engine with a memory logit θ; the heatmap's memory row is
checked against the engine and against p(z|x) and the per-source log-probs combined here by hand.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import gradio as gr
import pytest

from rag_demo import plots
from rag_demo.serving.background import BackgroundEngine
from rag_demo.results import AskResult, ClosedBookResult, RetrievedPassage, VariantResult
from rag_demo.ui.actions import DemoActions, unwrap
from rag_demo.ui.html import (
    MEMORY_UNAVAILABLE,
    esc,
    fmt_prob,
    format_answer_html,
    format_swap_summary,
    format_token_spans,
    knowledge_conflicts,
)
from rag_demo.ui.learn import format_learn_html
from rag_demo.ui.sentences import memory_sentence
from tests.ui_engine import KB_NAMES, QUESTIONS, with_memory

QUESTION = QUESTIONS[0]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def theta(ui_engine) -> float:
    """The questions' mean top passage logit: memory then takes a share of p(z|x), neither none nor all."""
    return sum(ui_engine.retrieve(q, k=3).passages[0].logit for q in QUESTIONS[:4]) / 4


@pytest.fixture(scope="module")
def actions(ui_engine, theta):
    return DemoActions(with_memory(ui_engine, theta))


def ask(actions, question=QUESTION, *, k=3, memory=True, variant="both"):
    """The Ask tab's event: the visitor's defaults, and the memory switch."""
    return actions.ask(question, variant, k, "flat", KB_NAMES[0], 1, "thorough", None, None, False, memory)


def softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    return [w / sum(weights) for w in weights]


def by_hand(result: AskResult, variant: VariantResult, theta: float) -> list[list[float]]:
    """(T, K + 1) the posterior over the passages and ∅, from p(z|x) (the logits and θ) and each source's
    log-probs (the passages', and ∅'s own: the closed-book ones), as the RAG equations combine them."""
    prior = softmax([p.logit for p in result.passages] + [theta])
    rows = [list(row) + [closed] for row, closed in zip(variant.doc_token_logprobs, variant.closed_book_token_logprobs)]
    if variant.variant == "sequence":  # the running posterior: log-probs summed up to each token
        rows = [[sum(r[z] for r in rows[: t + 1]) for z in range(len(prior))] for t in range(len(rows))]
    out = []
    for row in rows:
        joint = [math.log(p) + lp for p, lp in zip(prior, row)]
        top = max(joint)
        total = sum(math.exp(j - top) for j in joint)
        out.append([math.exp(j - top) / total for j in joint])
    return out


# ---- the Ask tab ---------------------------------------------------------------------------------


def test_the_heatmaps_memory_row_is_the_engines_and_the_equations(actions, theta):
    out = ask(actions)
    assert out.status == ""
    result = unwrap(out.last)
    assert result.memory_logit == theta and 0.01 < result.memory_prob < 0.99
    for name, heat in (("token", out.heat_token), ("sequence", out.heat_seq)):
        variant = result.variants[name]
        trace = heat["value"].data[0]
        assert len(trace.z) == len(result.passages) + 1  # the passages' rows, then memory's
        assert list(trace.z[-1]) == pytest.approx(variant.memory_posteriors, abs=1e-9)
        expected = by_hand(result, variant, theta)
        assert list(trace.z[-1]) == pytest.approx([row[-1] for row in expected], abs=1e-4)
        for j in range(len(result.passages)):  # and every passage row stays its own passage's
            assert list(trace.z[j]) == pytest.approx([row[j] for row in expected], abs=1e-4)
        for t in range(len(variant.tokens)):
            assert sum(row[t] for row in trace.z) == pytest.approx(1, abs=1e-5)
        assert heat["value"].layout.yaxis.ticktext[-1] == plots.MEMORY_NAME
        assert heat["value"].layout.yaxis.ticktext[0].startswith("#1 ")  # rows that name themselves


def test_the_p_z_chart_has_a_memory_bar_of_p_memory(actions, theta):
    out = ask(actions)
    result = unwrap(out.last)
    figure = out.doc_prob["value"]
    passages, memory = figure.data
    assert memory.name == plots.MEMORY_NAME and list(memory.x) == [result.memory_prob]
    prior = softmax([p.logit for p in result.passages] + [theta])
    assert list(passages.x) + list(memory.x) == pytest.approx(prior, abs=1e-6)
    assert sum(passages.x) + memory.x[0] == pytest.approx(1, abs=1e-6)
    assert figure.layout.yaxis.ticktext[-1] == plots.MEMORY_NAME and "θ" in figure.layout.title.text


def test_switched_off_there_is_no_memory_and_p_z_sums_to_one_over_k(actions):
    out = ask(actions, memory=False)
    result = unwrap(out.last)
    assert out.status == "" and result.memory_prob is None and result.memory_logit is None
    assert sum(p.prob for p in result.passages) == pytest.approx(1, abs=1e-6)
    assert len(out.doc_prob["value"].data) == 1
    for heat in (out.heat_token, out.heat_seq):
        trace = heat["value"].data[0]
        assert len(trace.z) == len(result.passages) and plots.MEMORY_NAME not in heat["value"].layout.yaxis.ticktext
        for t in range(len(trace.z[0])):
            assert sum(row[t] for row in trace.z) == pytest.approx(1, abs=1e-5)
    assert "rag-passage-memory" not in out.passages and "p(∅|x)" not in out.answer
    assert "(∅: memory)" not in out.answer and "grey for ∅" not in out.answer  # the legend names no ∅ either
    assert esc(MEMORY_UNAVAILABLE) not in out.answer  # switched off is no failure to report


def test_memory_has_a_card_among_the_passages_and_a_line_in_words(actions):
    out = ask(actions)
    result = unwrap(out.last)
    assert out.passages.count('class="rag-passage"') == len(result.passages)
    card = out.passages[out.passages.index("rag-passage-memory"):]
    assert f"p(∅|x) <b>{fmt_prob(result.memory_prob)}</b>" in card
    assert "The generator&#x27;s own memory: the question read with no passage" in card and f"θ {result.memory_logit:.2f}" in card
    assert f"p(∅|x) = {fmt_prob(result.memory_prob)}" in out.answer and "grey for ∅" in out.answer
    assert "(∅: memory)" in out.answer


def test_memory_as_the_largest_source_is_said_in_words_and_colours_the_tokens(ui_engine, theta):
    leading = DemoActions(with_memory(ui_engine, theta + 30))  # far above every passage's logit
    out = ask(leading)
    result = unwrap(out.last)
    assert result.memory_prob > 0.99 and plots.memory_leads(result)
    assert "∅ memory is the largest source" in out.answer and "leans on what the model remembers" in out.answer
    assert "the largest source" in out.passages
    grey = [plots.rgba(plots.MEMORY_COLOR, 0.12 + 0.6 * m) for m in result.variants["token"].memory_posteriors]
    spans = re.split(r'<span class="rag-tok[ "]', format_token_spans(result.variants["token"], result.passages))[1:]
    assert len(spans) == len(grey)
    for span, colour in zip(spans, grey):
        assert colour in span and "mostly ∅ memory" in span and plots.MEMORY_NAME in span
    quiet = DemoActions(with_memory(ui_engine, theta - 30))
    assert "largest source" not in ask(quiet).answer


def test_token_spans_point_at_memory_by_its_own_column():
    passage = RetrievedPassage(1, 0, "P", "text", 0.5, 0.3, 1.0)
    variant = VariantResult("token", "a b", ("a", " b"), (1, 2), -1.0, (-0.5, -0.5), ((-0.5,), (-0.5,)),
                            ((0.8,), (0.1,)), (-0.5, -0.5), memory_posteriors=(0.2, 0.9))
    first, second = re.split(r'<span class="rag-tok[ "]', format_token_spans(variant, (passage,)))[1:]
    assert "mostly passage #1 (0.80)" in first and plots.rgba(plots.passage_color(1), 0.12 + 0.6 * 0.8) in first
    assert "mostly ∅ memory (0.90)" in second and plots.rgba(plots.MEMORY_COLOR, 0.12 + 0.6 * 0.9) in second


# ---- the switch ----------------------------------------------------------------------------------


def test_where_no_logit_is_fitted_the_page_says_memory_is_unavailable(ui_engine):
    plain = DemoActions(ui_engine)  # the tiny models: no fitted logit
    assert "Unavailable" in plain.memory_options()["info"] and plain.memory_options()["interactive"] is False
    out = ask(plain)
    assert out.status == "" and unwrap(out.last).memory_prob is None
    assert esc(MEMORY_UNAVAILABLE) in out.answer
    score = plain.score(QUESTION, "Paris", KB_NAMES[0], 3, "flat", None, True)
    assert score.status == "" and esc(MEMORY_UNAVAILABLE) in score.cards
    swap = plain.swap(QUESTION, KB_NAMES[0], KB_NAMES[1], "token", 3, None, True)
    assert swap.status == "" and esc(MEMORY_UNAVAILABLE) in swap.left and esc(MEMORY_UNAVAILABLE) in swap.right


def test_the_switchs_help_follows_the_engine(actions, theta):
    assert f"θ = {theta:.2f}" in actions.memory_options()["info"] and "untick" in actions.memory_options("bm25")["info"]
    assert actions.memory_update("dense")["info"] == actions.memory_options("dense")["info"]
    assert actions.memory_options()["interactive"] is True
    served = DemoActions(BackgroundEngine(lambda progress: actions.engine).start())
    assert served.engine.wait(5) and served.engine.memory_logit() == theta
    assert served.poll(0).memory["info"] == actions.memory_options()["info"]
    assert DemoActions(BackgroundEngine(lambda progress: None)).memory_options() == {}  # not started


# ---- Swap, Score, Learn --------------------------------------------------------------------------


def test_swap_shows_p_memory_on_both_sides(actions):
    out = actions.swap(QUESTION, KB_NAMES[0], KB_NAMES[1], "both", 3, None, True)
    assert out.status == ""
    for column in (out.left, out.right):
        assert "rag-passage-memory" in column and "p(∅|x) = " in column
    off = actions.swap(QUESTION, KB_NAMES[0], KB_NAMES[1], "both", 3, None, False)
    assert "rag-passage-memory" not in off.left + off.right


def _side(kb: str, answer: str, passage_text: str, closed: str, memory: tuple[float, ...] = ()) -> AskResult:
    """A one-passage RAG-Token answer from `kb`, with the closed-book answer beside it."""
    passage = RetrievedPassage(1, 0, "", passage_text, 0.5, 0.6 if memory else 1.0, 10.0)
    found = (1,) if answer.lower() in passage_text.lower().split() else ()  # as the engine's found_in, for one-word answers
    variant = VariantResult("token", answer, (answer,), (1,), -1.0, (-1.0,), ((-1.0,),), ((0.2,),), (-0.5,),
                            memory_posteriors=memory, found_in=found)
    return AskResult("q", kb, "flat", 1, (passage,), {"token": variant},
                     ClosedBookResult(closed, (closed,), (-0.5,), -0.5), {},
                     memory_logit=1.0 if memory else None, memory_prob=0.4 if memory else None)


@pytest.mark.parametrize("answer, passage, closed, conflict", [
    ("Paris", "Lyon is the capital of France.", "Paris", True),  # memory's answer, against the passage
    ("Lyon", "Lyon is the capital of France.", "Paris", False),  # the passage's answer
    ("Paris", "Paris is the capital of France.", "Paris", False),  # both say it: no conflict
    ("Rome", "Lyon is the capital of France.", "Paris", False),  # neither: not memory's doing
])
def test_a_knowledge_conflict_is_said_in_words(answer, passage, closed, conflict):
    side = _side("nq-counterfactual", answer, passage, closed, memory=(0.8,))
    said = knowledge_conflicts(side)
    assert bool(said) == conflict
    if conflict:
        assert "the generator's memory outweighed the passages (a knowledge conflict" in said[0]
        assert "∅ memory's posterior on the answer is 0.80" in said[0]
        summary = format_swap_summary(_side("nq-wiki", "Paris", "Paris is the capital.", "Paris"), side)
        assert esc(said[0]) in summary and "closed-book, no passages → “Paris”" in summary


def test_conflict_sentences_are_escaped():
    side = _side("<kb>", "<b>x</b>", "nothing here", "<b>x</b>")
    summary = format_swap_summary(side, side)
    assert knowledge_conflicts(side) and "<b>x" not in summary and "<kb>" not in summary
    assert "&lt;b&gt;x&lt;/b&gt;" in summary


def test_a_real_swap_names_the_conflict_where_memory_wins(ui_engine, theta):
    leading = DemoActions(with_memory(ui_engine, theta + 30))
    out = leading.swap(QUESTION, KB_NAMES[0], KB_NAMES[1], "token", 3, None, True)
    asked = leading.engine.ask(QUESTION, kb=KB_NAMES[1], k=3, variants=("token",))
    assert asked.variants["token"].answer == asked.closed_book.answer  # memory outweighs every passage
    sentences = knowledge_conflicts(asked)  # the random model's answer is in no passage
    assert sentences and all(esc(sentence) in out.summary for sentence in sentences)
    # memory is the largest source: the passages do not match, so nothing conflicts with memory
    assert all("memory answered where the passages had nothing to say" in s and "conflict" not in s for s in sentences)


def test_memory_leading_over_off_topic_passages_is_no_knowledge_conflict():
    side = _side("wikipedia", "Olaf", "Snow is precipitation in the form of ice crystals.", "Olaf", memory=(0.9,))
    side = replace(side, memory_prob=0.7)  # above the passage's 0.6
    said = knowledge_conflicts(side)
    assert len(said) == 1 and "conflict" not in said[0] and "p(∅|x) = 0.70, the largest" in said[0]


def test_score_shows_memory_and_its_heatmap_row(actions, theta):
    out = actions.score(QUESTION, "Paris", KB_NAMES[0], 3, "flat", None, True)
    assert out.status == ""
    result = actions.engine.score(QUESTION, "Paris", kb=KB_NAMES[0], k=3)
    assert f"p(∅|x) = {fmt_prob(result.memory_prob)}" in out.cards
    assert f"{esc(plots.MEMORY_NAME)} <b>{fmt_prob(result.memory_prob)}</b>" in out.cards  # the priors line: the same figure
    trace = out.heat_token["value"].data[0]
    assert list(trace.z[-1]) == pytest.approx(result.variants["token"].memory_posteriors, abs=1e-6)
    assert list(trace.z[-1]) == pytest.approx([r[-1] for r in by_hand(result, result.variants["token"], theta)], abs=1e-4)
    off = actions.score(QUESTION, "Paris", KB_NAMES[0], 3, "flat", None, False)
    assert "p(∅|x)" not in off.cards and len(off.heat_token["value"].data[0].z) == 3


def test_learn_works_memory_into_every_sum(actions, theta):
    result = unwrap(ask(actions, k=4).last)
    markup = format_learn_html(result, 1)
    prior = softmax([result.scale * p.score for p in result.passages] + [theta])
    assert prior[-1] == pytest.approx(result.memory_prob, abs=1e-5)
    assert f"θ = {theta:.3f}" in markup and f"<b>{prior[-1]:.4f}</b>" in markup and "p(∅|x) = exp(θ)" in markup
    assert "+ exp(θ))" in markup  # the softmax's denominator
    token = result.variants["token"]
    t = min(1, len(token.tokens) - 1)
    sources = [p.prob for p in result.passages] + [result.memory_prob]
    lps = list(token.doc_token_logprobs[t]) + [token.closed_book_token_logprobs[t]]
    marginal = sum(p * math.exp(lp) for p, lp in zip(sources, lps))
    assert marginal == pytest.approx(math.exp(token.token_logprobs[t]), rel=1e-3) and fmt_prob(marginal) in markup
    sequence = result.variants["sequence"]
    whole = [sum(row[j] for row in sequence.doc_token_logprobs) for j in range(len(result.passages))]
    whole.append(sum(sequence.closed_book_token_logprobs))
    p_seq = sum(p * math.exp(lp) for p, lp in zip(sources, whole))
    assert p_seq == pytest.approx(math.exp(sequence.logprob), rel=1e-3) and fmt_prob(p_seq) in markup
    assert markup.count(esc(plots.MEMORY_NAME)) >= 3  # a row for ∅ in each table
    off = format_learn_html(unwrap(ask(actions, k=4, memory=False).last), 1)
    assert "exp(θ)" not in off and esc(plots.MEMORY_NAME) not in off


def test_memory_strings_are_escaped_and_its_figures_render(actions):
    result = unwrap(ask(actions).last)
    evil = replace(result, question="<script>q</script>", kb="<kb>")
    assert "<script" not in format_answer_html(evil) and "<kb>" not in format_answer_html(evil)
    for figure in (plots.doc_prob_figure(result), plots.posterior_heatmap(result.variants["token"], result.passages)):
        json.dumps(figure.to_plotly_json(), default=str)


def test_plots_doctests():
    import doctest

    assert doctest.testmod(plots).failed == 0


# ---- the JSON API --------------------------------------------------------------------------------


def test_ask_json_takes_the_switch_last_and_returns_memory(actions, ui_engine):
    on = actions.ask_json(QUESTION, "both", 3, "flat", "", "", False, True)
    json.dumps(on)
    assert on["memory_logit"] == actions.engine.memory_logit() and 0 < on["memory_prob"] < 1
    assert sum(p["prob"] for p in on["passages"]) + on["memory_prob"] == pytest.approx(1, abs=1e-5)
    for variant in on["variants"].values():
        assert len(variant["memory_posteriors"]) == len(variant["tokens"])
        for row, memory in zip(variant["posteriors"], variant["memory_posteriors"]):
            assert sum(row) + memory == pytest.approx(1, abs=1e-4)
    older = actions.ask_json(QUESTION, "both", 3, "flat", "", "", False)  # an older client: on where available
    assert older["memory_prob"] == pytest.approx(on["memory_prob"])
    off = actions.ask_json(QUESTION, "both", 3, "flat", "", "", False, False)
    assert off["memory_prob"] is None and off["memory_logit"] is None
    assert sum(p["prob"] for p in off["passages"]) == pytest.approx(1, abs=1e-5)
    assert all(not v["memory_posteriors"] for v in off["variants"].values())
    assert actions.ask_json(QUESTION, "token", 3, "flat", "", "", False, "off")["memory_prob"] is None
    with pytest.raises(gr.Error, match="memory must be true, false or empty"):
        actions.ask_json(QUESTION, "both", 3, "flat", "", "", False, "maybe")
    with pytest.raises(gr.Error, match="no fitted logit for the generator's memory"):  # required where there is none
        DemoActions(ui_engine).ask_json(QUESTION, "both", 3, "flat", "", "", False, True)
    assert DemoActions(ui_engine).ask_json(QUESTION, "token", 3)["memory_prob"] is None


def test_score_json_takes_the_switch_and_returns_memory(actions):
    on = actions.score_json(QUESTION, "Paris", "", 3, "flat", "both", "", True)
    assert on["closed_book"]["answer"] == "Paris" and 0 < on["memory_prob"] < 1
    assert len(on["variants"]["token"]["memory_posteriors"]) == len(on["variants"]["token"]["tokens"])
    off = actions.score_json(QUESTION, "Paris", "", 3, "flat", "both", "", False)
    assert off["memory_prob"] is None and sum(p["prob"] for p in off["passages"]) == pytest.approx(1, abs=1e-5)
    assert actions.score_json(QUESTION, "Paris", "", 3)["memory_prob"] == pytest.approx(on["memory_prob"])
    with pytest.raises(gr.Error, match="the answer is empty; give a non-blank answer"):  # the API's words, as for a question
        actions.score_json(QUESTION, " ")
    with pytest.raises(gr.Error, match="memory must be"):
        actions.score_json(QUESTION, "Paris", "", 3, "flat", "both", "", "memroy")


@pytest.mark.parametrize("memory, said", [
    ((0.9, 0.8), "and the answer leans on what the model remembers."),
    ((0.2, 0.3), "even so, the answer's tokens lean on the passages (∅ memory's posterior 0.25)."),
])
def test_memory_leading_p_z_x_is_told_apart_from_the_answer_leaning_on_it(memory, said):
    passage = RetrievedPassage(1, 0, "", "Paris is the capital.", 0.5, 0.3, 10.0)
    variant = VariantResult("token", "Paris", ("Paris", "\n\n"), (1, 2), -1.0, (-0.5, -0.5), ((-1.0,), (-1.0,)),
                            ((0.2,), (0.2,)), (-0.5, -0.5), memory_posteriors=memory, found_in=(1,))
    result = AskResult("q", "kb", "flat", 1, (passage,), {"token": variant}, None, {}, memory_logit=1.0, memory_prob=0.7)
    sentence = memory_sentence(result)
    assert sentence.startswith("∅ memory is the largest source: p(∅|x) = 0.700") and sentence.endswith(said)
    # with both variants, each share is named by its variant
    sequence = replace(variant, variant="sequence", memory_posteriors=(0.1, 0.05))
    both = memory_sentence(replace(result, variants={"token": variant, "sequence": sequence}))
    if memory == (0.2, 0.3):
        assert both.endswith("(∅ memory's posterior RAG-Token 0.25, RAG-Sequence 0.05).")


def test_memory_leading_with_the_two_variants_leaning_different_ways_says_so():
    passage = RetrievedPassage(1, 0, "", "Paris is the capital.", 0.5, 0.3, 10.0)

    def variant(name, memory):
        return VariantResult(name, "Paris", ("Paris", "\n\n"), (1, 2), -1.0, (-0.5, -0.5), ((-1.0,), (-1.0,)),
                             ((0.2,), (0.2,)), (-0.5, -0.5), memory_posteriors=memory, found_in=(1,))

    # RAG-Token's tokens sit on memory (mean 0.85); RAG-Sequence's running posterior ends on the passage (0.1).
    result = AskResult("q", "kb", "flat", 1, (passage,),
                       {"token": variant("token", (0.9, 0.8)), "sequence": variant("sequence", (0.6, 0.1))},
                       None, {}, memory_logit=1.0, memory_prob=0.7)
    sentence = memory_sentence(result)
    assert sentence.endswith("; the two answers lean on it differently (see each answer's tokens).")
    assert "leans on what the model remembers" not in sentence and "even so" not in sentence


def test_a_tiny_p_memory_is_written_as_a_power_of_ten_not_as_zero():
    passage = RetrievedPassage(1, 0, "", "Paris is the capital.", 0.5, 0.9996, 10.0)
    result = AskResult("q", "kb", "flat", 1, (passage,), {}, None, {}, memory_logit=1.0, memory_prob=0.0004)
    assert memory_sentence(result) == "∅ memory is a source beside the 1 passage: p(∅|x) = 4.00 × 10⁻⁴."
