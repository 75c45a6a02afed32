"""Example questions ordered by whether the demo answers them right (rag_demo.serving.featured)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rag_demo.serving.featured import VARIANTS, order_examples
from rag_demo.questions import KBQuestion
from tests.ui_engine import KB_NAMES, QUESTIONS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _questions(answer: str = "zz no such answer zz") -> dict[str, list[KBQuestion]]:
    """Four example questions of the first KB whose passages all say `answer`."""
    return {KB_NAMES[0]: [KBQuestion(q, answer, "x", answer, i, True) for i, q in enumerate(QUESTIONS[:4])]}


def test_examples_answered_right_come_first_and_the_order_is_saved(ui_engine, tmp_path, monkeypatch):
    said = {QUESTIONS[0]: ("wrong", "wrong"), QUESTIONS[1]: ("right", "wrong"),  # (RAG-Token, RAG-Sequence)
            QUESTIONS[2]: ("wrong", "wrong"), QUESTIONS[3]: ("right", "right")}
    asked = []

    def ask(question, **options):
        asked.append((question, options["k"], tuple(options["variants"]), options["closed_book"]))
        return SimpleNamespace(variants={v: SimpleNamespace(answer=a) for v, a in zip(VARIANTS, said[question])})

    monkeypatch.setattr(ui_engine, "ask", ask)
    questions = _questions("Right")
    steps = []
    order = order_examples(ui_engine, questions, cache_dir=tmp_path, progress=lambda *a: steps.append(a))
    # both right, then one, then none in their stored order
    assert order == {KB_NAMES[0]: [QUESTIONS[3], QUESTIONS[1], QUESTIONS[0], QUESTIONS[2]]}
    assert asked == [(q, 5, VARIANTS, False) for q in QUESTIONS[:4]]  # the page's defaults, once each
    assert steps[-1] == ("checking the example questions", 4, 4)
    saved = json.loads(next(tmp_path.glob("examples-*.json")).read_text())
    assert saved["right"][KB_NAMES[0]] == {QUESTIONS[0]: 0, QUESTIONS[1]: 1, QUESTIONS[2]: 0, QUESTIONS[3]: 2}

    def no_asking(*args, **kwargs):
        raise AssertionError("a saved order must be read, not checked again")

    monkeypatch.setattr(ui_engine, "ask", no_asking)
    assert order_examples(ui_engine, questions, cache_dir=tmp_path) == order
    with pytest.raises(AssertionError, match="checked again"):
        order_examples(ui_engine, _questions("other"), cache_dir=tmp_path)  # other stored answers: another key


def test_an_unwritable_or_broken_cache_only_costs_a_check(ui_engine, tmp_path):
    questions = _questions()
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    order = order_examples(ui_engine, questions, cache_dir=blocked / "featured")
    # none right: the stored order stays, but for the two whose variants differ, just after the first
    asked = {q: ui_engine.ask(q, kb=KB_NAMES[0], k=5, variants=VARIANTS, closed_book=False) for q in QUESTIONS[:4]}
    differing = [q for q, r in asked.items() if r.variants["token"].answer != r.variants["sequence"].answer]
    head = QUESTIONS[:1] + [q for q in differing[:2] if q != QUESTIONS[0]]
    assert order[KB_NAMES[0]] == head + [q for q in QUESTIONS[:4] if q not in head]
    order_examples(ui_engine, questions, cache_dir=tmp_path)
    saved = next(tmp_path.glob("examples-*.json"))
    saved.write_text("{broken")
    assert order_examples(ui_engine, questions, cache_dir=tmp_path) == order
    assert json.loads(saved.read_text())["order"] == order  # rewritten


def test_feature_checked_examples_reorders_the_engine_examples_of_kbs_with_questions(ui_engine, tmp_path):
    from rag_demo.retrieval.corpus import load_kb, save_kb
    from rag_demo.questions import QUESTIONS_FILE
    from rag_demo.engine import RagEngine
    from rag_demo.serving.featured import feature_checked_examples

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


def test_other_generator_weights_check_the_examples_again(ui_engine, monkeypatch):
    from rag_demo.serving.featured import order_key

    questions = _questions()
    before = order_key(ui_engine, questions)
    monkeypatch.setattr(ui_engine.generator, "weights", "gemma3-270m-reader-000000000000")
    assert order_key(ui_engine, questions) != before


def test_spare_questions_whose_variants_differ_join_the_examples_after_the_first(ui_engine, tmp_path, monkeypatch):
    said = {QUESTIONS[0]: ("Right", "Right"), QUESTIONS[1]: ("Right", "Right"),  # the examples: all agree
            QUESTIONS[2]: ("x", "x"), QUESTIONS[3]: ("Right", "Wrong"),  # spares: one agrees, three differ
            QUESTIONS[4]: ("a", "b"), QUESTIONS[5]: ("Wrong", "Right")}
    asked = []

    def ask(question, **options):
        asked.append(question)
        return SimpleNamespace(variants={v: SimpleNamespace(answer=a) for v, a in zip(VARIANTS, said[question])})

    monkeypatch.setattr(ui_engine, "ask", ask)
    examples = {KB_NAMES[0]: [KBQuestion(q, "Right", "x", "Right", i, True) for i, q in enumerate(QUESTIONS[:2])]}
    spares = {KB_NAMES[0]: [KBQuestion(q, "Right", "", "Right", -1) for q in QUESTIONS[2:]]}
    order = order_examples(ui_engine, examples, cache_dir=tmp_path, spares=spares)
    # spares are asked only until two differ with one variant right; those two follow the first example
    assert asked == QUESTIONS[:6]
    assert order == {KB_NAMES[0]: [QUESTIONS[0], QUESTIONS[3], QUESTIONS[5], QUESTIONS[1]]}
    saved = json.loads(next(tmp_path.glob("examples-*.json")).read_text())
    assert saved["differ"][KB_NAMES[0]] == [QUESTIONS[3], QUESTIONS[5], QUESTIONS[4]]
    asked.clear()
    assert order_examples(ui_engine, examples, cache_dir=tmp_path, spares=spares) == order and asked == []  # read back
    # without spares nothing differs: the examples keep their right-first order
    assert order_examples(ui_engine, examples, cache_dir=None) == {KB_NAMES[0]: QUESTIONS[:2]}
