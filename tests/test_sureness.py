"""How sure an answer is (`VariantResult.sureness`): the band its p(y|x) falls in, given only where it was measured,
and the badge the answer card shows for it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from rag_demo import sureness
from rag_demo.config import LIKELY_RIGHT_P, LIKELY_WRONG_P
from rag_demo.ui.html import format_answer_html
from tests.test_evidence import _result
from tests.ui_engine import KB_NAMES, QUESTIONS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def band(logprob: float) -> str:
    p = math.exp(logprob)
    return "likely right" if p >= LIKELY_RIGHT_P else "likely wrong" if p < LIKELY_WRONG_P else "unsure"


def test_no_band_where_none_was_measured(ui_engine):
    result = ui_engine.ask(QUESTIONS[0], kb=KB_NAMES[0], k=3)  # tiny models: not the measured setup
    assert all(v.sureness == "" for v in result.variants.values())
    assert "rag-sure" not in format_answer_html(result)


def measured_setup(monkeypatch, differences: list[str]) -> None:
    """The tiny engine taken for the default models on the general base, its ask differing by `differences`."""
    from rag_demo import engine, memory

    monkeypatch.setattr(memory, "fitted_for", lambda *args, **kwargs: True)
    monkeypatch.setattr(engine, "GENERAL_KBS", tuple(KB_NAMES))
    monkeypatch.setattr(sureness, "unmeasured_options", lambda **options: list(differences))


def test_where_measured_rag_tokens_answer_gets_the_band_of_its_p(ui_engine, monkeypatch):
    measured_setup(monkeypatch, [])
    monkeypatch.setattr(sureness, "LONG_ANSWER_WORDS", 10_000)  # the tiny generator's answers run long
    for question in QUESTIONS[:3]:
        result = ui_engine.ask(question, kb=KB_NAMES[0], k=3)
        token, sequence = result.variants["token"], result.variants["sequence"]
        assert token.sureness == band(token.logprob) and sequence.sureness == band(sequence.logprob)
        assert result.to_json()["variants"]["token"]["sureness"] == token.sureness
        assert not any("badge" in notice for notice in result.notices)
    # RAG-Sequence's bands were measured with thorough decoding: fast decoding scores fewer pairs, and has none
    fast = ui_engine.ask(QUESTIONS[0], kb=KB_NAMES[0], k=3, sequence_decoding="fast")
    assert fast.variants["sequence"].sureness == "" and fast.variants["token"].sureness
    said = [notice for notice in fast.notices if "badge" in notice]
    assert len(said) == 1 and "for RAG-Sequence's answer" in said[0] and said[0].endswith("this ask used fast")


def test_a_sentence_answer_gets_no_band_and_says_why(ui_engine, monkeypatch):
    measured_setup(monkeypatch, [])
    monkeypatch.setattr(sureness, "LONG_ANSWER_WORDS", 2)
    result = ui_engine.ask(QUESTIONS[0], kb=KB_NAMES[0], k=3)
    assert len(result.variants["token"].answer.split()) >= 2
    assert all(v.sureness == "" for v in result.variants.values())
    said = [notice for notice in result.notices if "badge" in notice]
    assert len(said) == 2 and "RAG-Token's answer: it is a sentence" in said[0] and "RAG-Sequence's" in said[1]
    short = replace(result.variants["token"], answer="Paris")
    assert sureness.banded({"token": short}, [])[0]["token"].sureness == band(short.logprob)


def test_an_ask_unlike_the_measured_one_says_why_it_has_no_band(ui_engine, monkeypatch):
    measured_setup(monkeypatch, ["k = 3", "memory off"])
    result = ui_engine.ask(QUESTIONS[0], kb=KB_NAMES[0], k=3)
    assert all(v.sureness == "" for v in result.variants.values())
    said = [notice for notice in result.notices if "badge" in notice]
    assert len(said) == 1 and said[0].endswith("this ask differs: k = 3, memory off")
    fast = ui_engine.ask(QUESTIONS[0], kb=KB_NAMES[0], k=3, sequence_decoding="fast")
    assert [n for n in fast.notices if "badge" in n][0].endswith("differs: k = 3, memory off, fast RAG-Sequence decoding")


def test_what_differs_from_the_measured_ask_is_named():
    measured = dict(kb="wikipedia", question="who wrote hamlet?", k=5, index="flat", retriever="hybrid", memory=True,
                    num_beams=1, extractive=False)
    assert sureness.unmeasured_options(**measured) == []
    for change, words in ((dict(kb="wikipedia-counterfactual"), "the wikipedia-counterfactual base"),
                          (dict(question="a pasted text " * 12 + "who wrote it?"), "a long question"),
                          (dict(question="¿quién escribió hamlet?"), "a question not in English"),
                          (dict(question="what did i eat for breakfast?"), "a question about you"),
                          (dict(question="who won the match yesterday?"), "a question about the present"),
                          (dict(question="who won the 2025 nba finals?"), "a question about a recent year"),
                          (dict(question="write a poem about cats"), "a request for writing"),
                          (dict(question="can penguins fly?"), "a yes/no question"),
                          (dict(question="who invented the light bulb and when did he die?"), "two questions in one"),
                          (dict(k=6), "k = 6"), (dict(index="ivfpq"), "the ivfpq index"),
                          (dict(retriever="dense"), "the dense retriever"), (dict(memory=False), "memory off"),
                          (dict(num_beams=2), "2 beams"), (dict(extractive=True), "copying"),
                          (dict(trained=True), "a question encoder trained on this page")):
        assert sureness.unmeasured_options(**(measured | change)) == [words], change


@pytest.mark.parametrize("p", [0.9, LIKELY_RIGHT_P, 0.19, LIKELY_WRONG_P, 0.049, 1e-9])
def test_the_bands_meet_at_the_measured_thresholds(p):
    assert sureness.answer_sureness(math.log(p)) == band(math.log(p))


@pytest.mark.parametrize("p", [0.19996, 0.1995, 0.19949, 0.04996, 0.0495, 0.04949])
def test_the_band_agrees_with_the_probability_the_card_prints(p):
    """A review saw "p(y|x) = 0.200 · unsure" for p = 0.19996: the badge must read the number as shown."""
    from rag_demo.ui.sentences import fmt_prob

    logprob = math.log(p)
    shown = float(fmt_prob(math.exp(logprob)))  # what the card prints beside the badge
    expected = "likely right" if shown >= LIKELY_RIGHT_P else "unsure" if shown >= LIKELY_WRONG_P else "likely wrong"
    assert sureness.answer_sureness(logprob) == expected


def test_the_card_shows_the_band_as_an_escaped_badge_that_explains_itself():
    result = _result("Rome", ["Paris."], "Rome")
    token = result.variants["token"]
    for variant, rates in (("token", ("76 of 80 times (95%)", "47 of 80 times (59%)", "14 of 57 times (25%)")),
                           ("sequence", ("76 of 81 times (94%)", "50 of 85 times (59%)", "11 of 53 times (21%)"))):
        for said, rate in zip(("likely right", "unsure", "likely wrong"), rates):
            marked = replace(result, variants={variant: replace(token, variant=variant, sureness=said)})
            shown = format_answer_html(marked)
            assert f'class="rag-sure rag-sure-{said.replace(" ", "-")}"' in shown and f">{said}</span>" in shown
            assert rate in shown, (variant, said)
