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


def test_where_measured_rag_tokens_answer_gets_the_band_of_its_p(ui_engine, monkeypatch):
    monkeypatch.setattr(sureness, "measured_for", lambda **options: True)
    for question in QUESTIONS[:3]:
        result = ui_engine.ask(question, kb=KB_NAMES[0], k=3)
        token, sequence = result.variants["token"], result.variants["sequence"]
        assert token.sureness == band(token.logprob)
        assert sequence.sureness == ""  # measured for RAG-Token only
        assert result.to_json()["variants"]["token"]["sureness"] == token.sureness


@pytest.mark.parametrize("p", [0.9, LIKELY_RIGHT_P, 0.19, LIKELY_WRONG_P, 0.049, 1e-9])
def test_the_bands_meet_at_the_measured_thresholds(p):
    assert sureness.answer_sureness(math.log(p)) == band(math.log(p))


def test_the_band_is_measured_for_the_default_options_on_the_general_base_only():
    measured = dict(setup_measured=True, kb="wikipedia", k=5, retriever="hybrid", memory=True, num_beams=1,
                    extractive=False)
    assert sureness.measured_for(**measured)
    for change in (dict(setup_measured=False), dict(kb="wikipedia-counterfactual"), dict(kb="my knowledge"), dict(k=3),
                   dict(retriever="dense"), dict(memory=False), dict(num_beams=4), dict(extractive=True)):
        assert not sureness.measured_for(**(measured | change)), change


def test_the_card_shows_the_band_as_an_escaped_badge_that_explains_itself():
    result = _result("Rome", ["Paris."], "Rome")
    token = result.variants["token"]
    for said in ("likely right", "unsure", "likely wrong"):
        marked = replace(result, variants={"token": replace(token, sureness=said)})
        shown = format_answer_html(marked)
        assert f'class="rag-sure rag-sure-{said.replace(" ", "-")}"' in shown and f">{said}</span>" in shown
        assert "19 times in 20" in shown
