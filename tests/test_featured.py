"""Example questions ordered by whether the demo answers them right (rag_demo.featured)."""

from __future__ import annotations

import json

import pytest

from rag_demo.data import KBQuestion
from rag_demo.featured import VARIANTS, order_examples
from tests.ui_engine import KB_NAMES, QUESTIONS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _questions(engine, right_in_both: set[str], right_in_token_only: set[str]) -> dict[str, list[KBQuestion]]:
    """Example questions whose stored answer is what the engine says for the chosen ones, nonsense for the rest."""
    items = []
    for i, question in enumerate(QUESTIONS[:4]):
        result = engine.ask(question, kb=KB_NAMES[0], k=5, variants=VARIANTS, closed_book=False)
        token, sequence = (result.variants[v].answer for v in VARIANTS)
        if question in right_in_both and token != sequence:
            pytest.skip("the tiny model's two variants differ on this question")
        answer = token if question in right_in_both | right_in_token_only else "zz no such answer zz"
        items.append(KBQuestion(question, answer, "x", answer, i, True))
    return {KB_NAMES[0]: items}


def test_examples_answered_right_come_first_and_the_order_is_saved(ui_engine, tmp_path, monkeypatch):
    both, token_only = {QUESTIONS[3]}, {QUESTIONS[1]}
    questions = _questions(ui_engine, both, token_only)
    token = {q: r.variants["token"].answer for q, r in
             ((q, ui_engine.ask(q, kb=KB_NAMES[0], k=5, variants=VARIANTS, closed_book=False)) for q in token_only)}
    sequence_right = {q for q in token_only if ui_engine.ask(q, kb=KB_NAMES[0], k=5, variants=VARIANTS,
                                                              closed_book=False).variants["sequence"].answer == token[q]}
    steps = []
    order = order_examples(ui_engine, questions, cache_dir=tmp_path, progress=lambda *a: steps.append(a))
    expected_first = [QUESTIONS[3]] + sorted(sequence_right, key=QUESTIONS.index)
    assert order[KB_NAMES[0]][: len(expected_first)] == expected_first
    assert sorted(order[KB_NAMES[0]]) == sorted(QUESTIONS[:4])  # reordered, none dropped
    if not sequence_right:
        assert order[KB_NAMES[0]][1] == QUESTIONS[1]  # one variant right beats none
    assert steps[-1] == ("checking the example questions", 4, 4)
    saved = json.loads(next(tmp_path.glob("examples-*.json")).read_text())
    assert saved["right"][KB_NAMES[0]][QUESTIONS[3]] == 2

    def no_asking(*args, **kwargs):
        raise AssertionError("a saved order must be read, not checked again")

    monkeypatch.setattr(ui_engine, "ask", no_asking)
    assert order_examples(ui_engine, questions, cache_dir=tmp_path) == order
    changed = {KB_NAMES[0]: [*questions[KB_NAMES[0]][:3], KBQuestion(QUESTIONS[3], "other", "x", "other", 3, True)]}
    with pytest.raises(AssertionError, match="checked again"):
        order_examples(ui_engine, changed, cache_dir=tmp_path)  # another stored answer: another key


def test_an_unwritable_or_broken_cache_only_costs_a_check(ui_engine, tmp_path):
    questions = _questions(ui_engine, set(), set())
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    order = order_examples(ui_engine, questions, cache_dir=blocked / "featured")
    assert order[KB_NAMES[0]] == QUESTIONS[:4]  # none right: the stored order stays
    order_examples(ui_engine, questions, cache_dir=tmp_path)
    saved = next(tmp_path.glob("examples-*.json"))
    saved.write_text("{broken")
    assert order_examples(ui_engine, questions, cache_dir=tmp_path) == order
    assert json.loads(saved.read_text())["order"] == order  # rewritten


def test_feature_checked_examples_reorders_the_engine_examples_of_kbs_with_questions(ui_engine, tmp_path):
    from rag_demo.corpus import load_kb, save_kb
    from rag_demo.data import QUESTIONS_FILE
    from rag_demo.engine import RagEngine
    from rag_demo.featured import feature_checked_examples

    kb = load_kb(save_kb(ui_engine.kbs[KB_NAMES[0]], tmp_path / "kb"), name=KB_NAMES[0])
    rows = [{"question": q, "answer": "a", "swapped_answer": "b", "passage_answer": "zz no such answer zz",
             "gold_id": i, "example": i < 3} for i, q in enumerate(QUESTIONS)]
    (kb.path / QUESTIONS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    other = ui_engine.kbs[KB_NAMES[1]]  # no questions file: its examples stay as given
    engine = RagEngine(encoder=ui_engine.encoder, generator=ui_engine.generator, kbs={KB_NAMES[0]: kb, KB_NAMES[1]: other},
                       config=ui_engine.config, examples={KB_NAMES[0]: ["stale"], KB_NAMES[1]: ["kept"]})
    feature_checked_examples(engine, cache_dir=tmp_path / "featured")
    assert engine.example_questions(KB_NAMES[0]) == QUESTIONS[:3]  # the flagged ones; none right, so stored order
    assert engine.example_questions(KB_NAMES[1]) == ["kept"]
    assert len(list((tmp_path / "featured").glob("examples-*.json"))) == 1
