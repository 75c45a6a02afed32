"""The demo's central picture, pinned: RAG-Token's per-token posteriors p(z|x,y_t,y<t) and RAG-Sequence's
running posteriors p(z|x,y<=t), as `RagEngine.ask` and `score` return them for multi-token answers,
equal a computation by hand from p(z|x) and the per-source token log-probs; and the heatmap's cells,
the Learn tab's worked numbers and the JSON API's posteriors are that same engine output.

By hand means plain Python floats here, not `rag_demo.marginalize`: put `rag_sequence_posteriors`
where the engine calls `rag_token_posteriors` (or the other way round) and these tests fail.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from rag_demo.results import AskResult, VariantResult
from rag_demo.ui.actions import DemoActions, unwrap
from rag_demo.ui.learn import format_learn_html
from tests.ui_engine import KB_NAMES, QUESTIONS, with_memory

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ANSWER = "paris is the capital city"  # several tokens under any tokenizer


def normalized(weights: list[float]) -> list[float]:
    return [w / sum(weights) for w in weights]


def sources(result: AskResult, variant: VariantResult) -> tuple[list[float], list[list[float]]]:
    """p(z|x) over the sources, and (T, S) log p(y_t|x,z,y<t): the passages, then ∅ memory (which reads
    the closed-book prompt) when it was a source."""
    memory = result.memory_prob is not None
    prior = [p.prob for p in result.passages] + ([result.memory_prob] if memory else [])
    rows = [list(row) + ([closed] if memory else [])
            for row, closed in zip(variant.doc_token_logprobs, variant.closed_book_token_logprobs)]
    return prior, rows


def token_posteriors_by_hand(prior: list[float], rows: list[list[float]]) -> list[list[float]]:
    """Each token on its own: p(z|x) p(y_t|x,z,y<t), normalized over z."""
    return [normalized([p * math.exp(lp) for p, lp in zip(prior, row)]) for row in rows]


def sequence_posteriors_by_hand(prior: list[float], rows: list[list[float]]) -> list[list[float]]:
    """The whole prefix: p(z|x) prod_{j<=t} p(y_j|x,z,y<j), normalized over z (renormalized at each
    step, which leaves the ratios alone and keeps long answers from underflowing)."""
    out, running = [], list(prior)
    for row in rows:
        running = normalized([r * math.exp(lp) for r, lp in zip(running, row)])
        out.append(running)
    return out


def engine_posteriors(result: AskResult, variant: VariantResult) -> list[list[float]]:
    memory = result.memory_prob is not None
    return [list(row) + ([variant.memory_posteriors[t]] if memory else []) for t, row in enumerate(variant.posteriors)]


@pytest.fixture(scope="module", params=[False, True], ids=["paper", "memory"])
def engine(request, ui_engine):
    """The tiny engine with the paper's formulas, and with memory a source at the top passage's mean logit
    (so that ∅ takes a real share of p(z|x))."""
    if not request.param:
        return ui_engine
    theta = sum(ui_engine.retrieve(q, k=3).passages[0].logit for q in QUESTIONS[:4]) / 4
    return with_memory(ui_engine, theta)


def results(engine) -> list[AskResult]:
    asked = [engine.ask(q, kb=KB_NAMES[0], k=3, max_new_tokens=6, closed_book=False) for q in QUESTIONS[:3]]
    scored = [engine.score(QUESTIONS[0], ANSWER, kb=KB_NAMES[0], k=4)]
    return asked + scored


def test_both_variants_posteriors_equal_the_equations_by_hand(engine):
    multi_token = 0
    for result in results(engine):
        assert (result.memory_prob is not None) == (engine.config.memory.logit is not None)
        for variant in result.variants.values():
            prior, rows = sources(result, variant)
            by_hand = (token_posteriors_by_hand if variant.variant == "token" else sequence_posteriors_by_hand)(prior, rows)
            got = engine_posteriors(result, variant)
            assert len(got) == len(variant.tokens) == len(rows)
            for t, (mine, theirs) in enumerate(zip(got, by_hand)):
                assert mine == pytest.approx(theirs, abs=1e-4), f"{variant.variant} token {t}"
            multi_token += len(variant.tokens) > 2
    assert multi_token >= 4  # the variants' posteriors part ways only after the first token


def test_on_a_scored_answer_the_two_pictures_differ_after_the_first_token(engine):
    """The same answer tokens under both variants: the first rows agree (nothing read yet but one token),
    later ones do not, so a test that confused the two formulas would see it."""
    result = engine.score(QUESTIONS[0], ANSWER, kb=KB_NAMES[0], k=4)
    token, sequence = result.variants["token"], result.variants["sequence"]
    assert token.token_ids == sequence.token_ids and len(token.tokens) >= 3
    first_t, first_s = engine_posteriors(result, token)[0], engine_posteriors(result, sequence)[0]
    assert first_t == pytest.approx(first_s, abs=1e-6)
    apart = max(abs(a - b) for t in range(1, len(token.tokens))
                for a, b in zip(engine_posteriors(result, token)[t], engine_posteriors(result, sequence)[t]))
    assert apart > 1e-3
    # RAG-Sequence's last running posterior is p(z|x,y) ∝ p(z|x) p(y|x,z): Bayes on the whole answer
    prior, rows = sources(result, sequence)
    whole = normalized([p * math.exp(sum(row[z] for row in rows)) for z, p in enumerate(prior)])
    assert engine_posteriors(result, sequence)[-1] == pytest.approx(whole, abs=1e-4)


LEARN_ROW = re.compile(r"<tr><td>.*?</td>(?:<td>[^<]*</td>){3}<td><b>([0-9.]+)</b></td></tr>")


def learn_columns(html: str) -> tuple[list[float], list[float]]:
    """The Learn tab's posterior columns: RAG-Token's (step 2) and RAG-Sequence's (step 3)."""
    token_part = html[html.index("<h3>2 ·"):html.index("<h3>3 ·")]
    sequence_part = html[html.index("<h3>3 ·"):]
    return ([float(x) for x in LEARN_ROW.findall(token_part)], [float(x) for x in LEARN_ROW.findall(sequence_part)])


def test_heatmaps_learn_tab_and_json_show_the_engines_posteriors(engine):
    actions = DemoActions(engine)
    memory = engine.config.memory.logit is not None
    question = QUESTIONS[1]
    out = actions.ask(question, "both", 3, "flat", KB_NAMES[0], 1, "thorough", None, None, False, memory)
    assert out.status == ""
    result = unwrap(out.last)
    for name, heat in (("token", out.heat_token), ("sequence", out.heat_seq)):
        variant = result.variants[name]
        cells = heat["value"].data[0].z  # (sources, T): one column per answer token
        expected = engine_posteriors(result, variant)
        for t in range(len(variant.tokens)):
            assert [row[t] for row in cells] == pytest.approx(expected[t], abs=1e-9)
    for t in range(len(result.variants["token"].tokens)):
        token_column, sequence_column = learn_columns(format_learn_html(result, t))
        assert token_column == pytest.approx(engine_posteriors(result, result.variants["token"])[t], abs=5e-4)
        assert sequence_column == pytest.approx(engine_posteriors(result, result.variants["sequence"])[-1], abs=5e-4)
    api = json.loads(json.dumps(actions.ask_json(question, "both", 3, "flat", KB_NAMES[0], "", False, memory)))
    for name, variant in result.variants.items():
        assert len(api["variants"][name]["posteriors"]) == len(variant.posteriors)
        for sent, row in zip(api["variants"][name]["posteriors"], variant.posteriors):
            assert sent == pytest.approx(list(row), abs=1e-6)
        assert api["variants"][name]["memory_posteriors"] == pytest.approx(list(variant.memory_posteriors), abs=1e-6)
