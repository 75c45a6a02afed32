from __future__ import annotations

import io
import json

import pytest

from rag_demo.errors import InputError
from rag_demo.evaluate import (EvalQuestion, answer_record, contains_answer, evaluate, evaluate_table, exact_match, f1_score,
                               _Tally, normalize_answer, print_table, sample_kb,
                               wilson_interval)


def test_squad_normalization_and_scores():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert exact_match("the Colorado River", "Colorado River") and not exact_match("Colorado", "Colorado River")
    assert f1_score("Colorado", "Colorado River") == pytest.approx(2 / 3)
    assert contains_answer("it was Louis Armstrong , in 1967", "Louis Armstrong")
    assert not contains_answer("Louis Armstrongs", "Louis Armstrong")


def _questions(engine, kb):
    items = []
    for row, question in enumerate(["what is the first passage about", "who is named in the second", "where is it"]):
        # the gold answer is what the engine says with k=1 for the first question, so EM is not all zeros
        answer = engine.ask(question, kb=kb, k=1, variants=("token",), closed_book=False).variants["token"].answer
        items.append(EvalQuestion(question, answer if row == 0 else "zzz", "real world" if row == 2 else (answer if row == 0 else "zzz"), row))
    return items


def test_table_rows_match_single_evaluations(tiny_engine):
    kb = tiny_engine.default_kb
    questions = _questions(tiny_engine, kb)
    reports = evaluate_table(tiny_engine, kbs=(kb,), ks=(1, 2), n=3, seed=0, questions={kb: questions})
    assert [(r["variant"], r["k"]) for r in reports] == [
        ("token", 1), ("sequence", 1), ("token", 2), ("sequence", 2), ("closed-book", None)]
    by_key = {(r["variant"], r["k"]): r for r in reports}
    for variant, k in (("token", 1), ("sequence", 2)):
        alone = evaluate(tiny_engine, kb=kb, variant=variant, n=3, seed=0, k=k, questions=questions)
        for key in ("exact_match", "f1", "answer_recall", "retrieval_recall", "original_match", "n"):
            assert alone[key] == by_key[variant, k][key]
    token_k1 = by_key["token", 1]
    assert token_k1["exact_match"] >= 1 / 3  # the first question's answer is the engine's own
    assert token_k1["original_match"] is not None and by_key["closed-book", None]["retrieval_recall"] is None
    # k=1 retrieves one passage: both variants give the same answer, hence the same scores
    assert by_key["token", 1]["exact_match"] == by_key["sequence", 1]["exact_match"]
    out = io.StringIO()
    print_table(reports, out)
    lines = out.getvalue().split("\n\n")[0].splitlines()
    assert len(lines) == 2 + len(reports) and lines[-1].startswith(f"| {kb} | {len(tiny_engine.resolve_kb(kb)):,} | - | closed-book | - | 3 |")
    assert "s/question: the seconds of the ask that answered it" in out.getvalue()


def test_unknown_variant_and_empty_sample_are_input_errors(tiny_engine):
    with pytest.raises(InputError, match="unknown variant"):
        evaluate(tiny_engine, kb=tiny_engine.default_kb, variant="tokens", n=1, seed=0)
    with pytest.raises(InputError, match="at least 1"):
        evaluate(tiny_engine, kb=tiny_engine.default_kb, variant="token", n=0, seed=0,
                 questions=[EvalQuestion("q", "a", "a", 0)])
    with pytest.raises(InputError, match="no evaluation questions"):
        evaluate(tiny_engine, kb=tiny_engine.default_kb, variant="token", n=1, seed=0, questions=[])


def test_kb_sample_keeps_the_questions_it_answers_with_renumbered_gold_rows(tiny_engine):
    from dataclasses import replace

    kb = tiny_engine.resolve_kb(tiny_engine.default_kb)
    questions = [EvalQuestion(f"question {row}", "a", "a", row) for row in range(len(kb))]
    sample, kept = sample_kb(kb, questions, 3, seed=5)
    assert len(sample) == 3 and len(kept) == 3
    for item in kept:  # the renumbered gold row is the same passage as before
        original = int(item.question.split()[1])
        assert sample.passage(item.gold_id) == kb.passage(original)
        assert (sample.embeddings[item.gold_id] == kb.embeddings[original]).all()
    # a row-aligned copy of the KB gets the same rows for the same seed
    twin = replace(kb, name="twin")
    assert [q.question for q in sample_kb(twin, questions, 3, seed=5)[1]] == [q.question for q in kept]
    assert sample_kb(kb, questions, len(kb), seed=5) == (kb, questions)
    with pytest.raises(InputError, match="at least 1"):
        sample_kb(kb, questions, 0, seed=5)
    report = evaluate(tiny_engine, kb=kb.name, variant="token", n=2, seed=5, k=1, questions=questions, kb_sample=3)
    assert report["kb_passages"] == 3 and report["n"] == 2


def test_gold_passage_reads_the_gold_row_alone_and_reports_the_common_answer(tiny_engine):
    kb = tiny_engine.default_kb
    questions = _questions(tiny_engine, kb)
    reports = evaluate_table(tiny_engine, kbs=(kb,), ks=(2, 3), n=3, seed=0, questions={kb: questions},
                             variants=("token", "closed-book"), gold_passage=True)
    token = next(r for r in reports if r["variant"] == "token")
    assert token["k"] == 1 and token["gold_passage"] and token["retrieval_recall"] == 1.0
    for item in questions:  # each answer is the one the gold passage alone gives
        alone = tiny_engine.ask(item.question, kb=kb, rows=[item.gold_id], variants=("token",), closed_book=False)
        assert [p.id for p in alone.passages] == [item.gold_id] and alone.passages[0].prob == pytest.approx(1.0)
    closed = next(r for r in reports if r["variant"] == "closed-book")
    answers = [normalize_answer(tiny_engine.closed_book(q.question).answer) for q in questions]
    top = max(set(answers), key=answers.count)
    assert closed["most_common_answer"] == top and closed["most_common_share"] == pytest.approx(answers.count(top) / 3)
    out = io.StringIO()
    print_table(reports, out)
    assert "token, gold passage" in out.getvalue()


def test_rows_outside_the_kb_are_input_errors(tiny_engine):
    with pytest.raises(InputError, match="passage rows"):
        tiny_engine.ask("q", rows=[10_000], closed_book=False)
    with pytest.raises(InputError, match="passage rows"):
        tiny_engine.ask("q", rows=[], closed_book=False)


def test_wilson_intervals_hold_the_estimate_and_narrow_with_n():
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    low, high = wilson_interval(60, 100)
    assert low < 0.6 < high and high - low == pytest.approx(0.189, abs=0.002)
    wide, narrow = wilson_interval(6, 10), wilson_interval(600, 1000)
    assert narrow[1] - narrow[0] < (wide[1] - wide[0]) / 3
    tally = _Tally()
    for hit in (True, False, True, True):
        tally.add(answer_record(EvalQuestion("q", "x", "y", 0), "x" if hit else "z", kb="kb", variant="token", k=1, retrieved=True))
    out = tally.report(variant="token")
    assert out["exact_match"] == 0.75 and out["intervals"]["exact_match"] == pytest.approx(wilson_interval(3, 4))
    assert out["original_match"] == 0.0 and out["most_common_answer"] == "x" and out["most_common_share"] == 0.75


def test_eval_asks_every_held_out_question_stored_beside_the_kb_and_nothing_else(tiny_engine, tiny_kb, tmp_path, monkeypatch):
    """eval reads the KB's questions.jsonl and asks its held-out questions only: no training question and
    no example question the split keeps out of training; exact match is scored after SQuAD normalization."""
    import json
    from dataclasses import replace

    from rag_demo.questions import QUESTIONS_FILE, load_questions, split_questions

    def store(records):
        with (tmp_path / QUESTIONS_FILE).open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records)
        return split_questions(load_questions(tmp_path))

    # three questions per passage: each passage's three are one group (they share their gold passage)
    records = [{"question": f"{word} question about passage {row}", "answer": f"{word} answer {row}", "swapped_answer": "",
                "passage_answer": "zzz", "gold_id": row} for row in range(len(tiny_kb)) for word in ("first", "second", "third")]
    split = store(records)
    held = {q.question for q in split.held_out}
    assert len(held) == 3 and len(split.training) == 15  # one group held out: about 18 / 5 questions
    kb = replace(tiny_kb, path=tmp_path)
    first, second, third = sorted(held)
    answer = tiny_engine.ask(first, kb=kb, k=1, variants=("token",), closed_book=False).variants["token"].answer
    assert normalize_answer(answer)  # something to match
    example = next(r for r in records if r["question"] not in held)
    example["example"] = True  # its group leaves training and is not held out either
    for r in records:
        if r["question"] == first:
            r["passage_answer"] = f"The {answer}!"  # the same answer once normalized
        elif r["question"] == third:
            r["passage_answer"] = ""  # no clear answer in this KB: not scored
    split = store(records)
    assert {q.question for q in split.held_out} == held and example["question"] not in {q.question for q in split.training}

    monkeypatch.setitem(tiny_engine.kbs, "tiny-with-questions", kb)
    asked = []
    ask = tiny_engine.ask
    # on the class: undone, an instance attribute would stay behind, bound to this engine, in its copies too
    monkeypatch.setattr(type(tiny_engine), "ask",
                        lambda self, question, **options: asked.append(question) or ask(question, **options))
    report = evaluate(tiny_engine, kb="tiny-with-questions", variant="token", n=100, seed=0, k=1)
    assert sorted(asked) == [first, second] and report["n"] == 2
    found = [ask(q, kb=kb, k=1, closed_book=False).passages[0].id == int(q.split()[-1]) for q in (first, second)]
    assert report["exact_match"] == 0.5 and report["retrieval_recall"] == sum(found) / 2


def test_every_scored_answer_reaches_the_answers_sink_as_it_was_counted(tiny_engine):
    kb = tiny_engine.default_kb
    questions = _questions(tiny_engine, kb)
    records = []
    reports = evaluate_table(tiny_engine, kbs=(kb,), ks=(1, 2), n=3, seed=0, questions={kb: questions}, answers=records.append)
    assert len(records) == 3 * 5  # three questions, each: token and sequence at k = 1 and 2, and closed-book
    for report in reports:
        mine = [r for r in records if (r["variant"], r["k"]) == (report["variant"], report["k"])]
        assert len(mine) == report["n"] == 3 and all(r["kb"] == kb for r in mine)
        assert sum(r["exact_match"] for r in mine) / 3 == report["exact_match"]
        assert {r["question"] for r in mine} == {q.question for q in questions}
    closed = [r for r in records if r["variant"] == "closed-book"]
    assert all(r["k"] is None and r["retrieved"] is None for r in closed)
    by_question = {q.question: q for q in questions}
    for r in records:  # a real-world answer is scored only where the KB swapped it (the third question)
        asked = by_question[r["question"]]
        assert (r["original_match"] is None) == (normalize_answer(asked.original_answer) == normalize_answer(asked.answer))
    assert sum(r["original_match"] is not None for r in records) == 5
    first = next(r for r in records if r["question"] == questions[0].question and r["variant"] == "token" and r["k"] == 1)
    assert first["exact_match"] and first["prediction"] == questions[0].answer
    # each answer's log p(y|x), as the engine gives it for the same ask
    asked = tiny_engine.ask(questions[0].question, kb=kb, k=1, closed_book=True)
    assert first["logprob"] == pytest.approx(asked.variants["token"].logprob, abs=1e-5)
    closed_first = next(r for r in closed if r["question"] == questions[0].question)
    assert closed_first["logprob"] == pytest.approx(asked.closed_book.logprob, abs=1e-5)


def test_aliases_count_and_a_question_set_scores_retrieval_by_answer_bearing_passages(tiny_engine, tmp_path):
    from rag_demo.questions import set_eval_questions

    kb = tiny_engine.default_kb
    knowledge = tiny_engine.resolve_kb(kb)
    question = "what is the first passage about"
    answer = tiny_engine.ask(question, kb=kb, k=1, variants=("token",), closed_book=False).variants["token"].answer
    words = knowledge.texts[0].split()
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps({"question": question, "answers": ["zzz", answer]}) + "\n"
                    + json.dumps({"question": "who is named in the second", "answers": [f"{words[0]} {words[1]}"]}) + "\n")
    items = set_eval_questions(path)
    assert items[0].answers == ("zzz", answer) and items[0].gold_id is None
    report = evaluate(tiny_engine, kb=kb, variant="token", n=2, seed=0, k=len(knowledge), questions=items)
    records = []
    evaluate(tiny_engine, kb=kb, variant="token", n=2, seed=0, k=len(knowledge), questions=items, answers=records.append)
    by_question = {r["question"]: r for r in records}
    assert by_question[question]["exact_match"] == bool(normalize_answer(answer))  # the second alias is the answer
    assert by_question["who is named in the second"]["retrieved"]  # every passage was read: passage 0 holds the words
    assert report["n"] == 2
    with pytest.raises(InputError, match="gold passages"):
        evaluate(tiny_engine, kb=kb, variant="token", n=1, seed=0, questions=items, gold_passage=True)
    with pytest.raises(InputError, match="gold passages"):
        evaluate(tiny_engine, kb=kb, variant="token", n=1, seed=0, questions=items, kb_sample=2)


def test_eval_says_when_memory_was_a_source(tiny_engine):
    from dataclasses import replace

    from rag_demo.config import MemoryConfig

    kb = tiny_engine.default_kb
    questions = [EvalQuestion("who wrote a farewell to arms", "zzz", "zzz", 0)]
    off = evaluate(tiny_engine, kb=kb, variant="token", n=1, seed=0, k=2, questions=questions)
    assert off["memory_logit"] is None
    config = tiny_engine.config
    try:
        tiny_engine.config = replace(config, memory=MemoryConfig(logit=1.5))
        on = evaluate(tiny_engine, kb=kb, variant="token", n=1, seed=0, k=2, questions=questions)
        again_off = evaluate(tiny_engine, kb=kb, variant="token", n=1, seed=0, k=2, questions=questions, memory=False)
    finally:
        tiny_engine.config = config
    assert on["memory_logit"] == 1.5 and again_off["memory_logit"] is None
    out = io.StringIO()
    print_table([on], out)
    assert "memory θ=1.5" in out.getvalue()


def test_the_counterfactual_set_expects_the_substitute_only_for_a_swapped_persons_name():
    from rag_demo.evaluate import counterfactual_questions
    from rag_demo.offline.swapped import SwappedWorld

    world = SwappedWorld([], {"Edwin Hubble": "Caroline Herschel", "Caroline Herschel": "Edwin Hubble"}, frozenset(),
                         {"Edwin Hubble": "Hubble", "Caroline Herschel": "Herschel"})
    person = EvalQuestion("who showed the universe expands?", "Edwin Hubble", "Edwin Hubble", None, ("Edwin Hubble", "Hubble"),
                          ("Edwin Hubble", "Hubble"))
    telescope = EvalQuestion("which space telescope was launched in 1990?", "Hubble Space Telescope", "Hubble Space Telescope",
                             None, ("Hubble Space Telescope", "Hubble"), ("Hubble Space Telescope", "Hubble"))
    swapped = counterfactual_questions([person, telescope], world)
    assert [(q.question, q.answers, q.original_answers) for q in swapped] == [
        (person.question, ("Caroline Herschel", "Herschel"), ("Edwin Hubble", "Hubble"))]


def test_the_report_says_what_each_figure_is_and_checks_for_one_repeated_answer_only_on_enough_questions():
    import io

    from rag_demo.evaluate import REPORT_MEANS, print_report

    report = {"variant": "token", "kb": "kb", "kb_passages": 10, "n": 5, "k": 5, "retriever": "hybrid", "seed": 0,
              "exact_match": 0.6, "f1": 0.7, "answer_recall": 0.6, "retrieval_recall": 0.8, "original_match": None,
              "intervals": {}, "most_common_share": 0.4, "most_common_answer": "Paris", "seconds_per_question": 1.0}
    for n, repeated in ((5, False), (40, True)):
        out = io.StringIO()
        print_report({**report, "n": n}, out)
        lines = out.getvalue().splitlines()
        for key, means in REPORT_MEANS.items():
            assert any(line.split()[0] == key and line.endswith(means) for line in lines[1:]), key
        assert ("most common answer 'Paris': 40% of answers" in out.getvalue()) == repeated
