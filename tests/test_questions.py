"""The held-out split: whole groups of linked questions on one side, about one in five held out."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rag_demo import questions as qs
from rag_demo.errors import KnowledgeBaseError
from rag_demo.questions import KBQuestion


def _q(text: str, answer: str, gold: int, example: bool = False) -> KBQuestion:
    return KBQuestion(text, answer, "swapped " + answer, answer, gold, example)


def _synthetic(n: int = 2000, seed: int = 0) -> list[KBQuestion]:
    """Questions on n // 2 passages; about a third come with a reworded twin on another passage."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(300)]
    out = []
    for i in range(n):
        text = " ".join(rng.sample(words, 6))
        out.append(_q(f"who {text}", f"answer {i % 700}", rng.randrange(n // 2)))
        if i % 3 == 0:  # the same words reordered, the same answer, another passage
            twin = text.split()
            rng.shuffle(twin)
            out.append(_q(f"who {' '.join(twin)}", f"answer {i % 700}", rng.randrange(n // 2)))
    return out


def _leaks(split: qs.QuestionSplit) -> list[tuple[str, str]]:
    """Held-out questions with a training question of the same normalized answer and Jaccard ≥ 0.5 (brute force)."""
    found = []
    for held in split.held_out:
        for trained in split.training:
            if (qs.normalize_answer(held.answer) == qs.normalize_answer(trained.answer)
                    and qs.jaccard(qs.question_words(held.question), qs.question_words(trained.question)) >= 0.5):
                found.append((held.question, trained.question))
    return found


def test_groups_link_shared_passages_and_near_duplicates_transitively():
    items = [
        _q("who plays the queen in star wars episode 1", "Natalie Portman", 0),
        _q("who plays the queen in episode 1 star wars", "natalie portman!", 5),  # reworded, another passage
        _q("what did the queen in star wars wear", "a gown", 5),  # shares passage 5
        _q("who plays the queen in star wars episode 1", "Keira Knightley", 9),  # same words, another answer
        _q("who sang it", "Natalie Portman", 7),  # same answer, other words
    ]
    groups = qs.question_groups(items)
    assert groups[0] == groups[1] == groups[2]
    assert len({groups[0], groups[3], groups[4]}) == 3


def test_split_holds_out_about_one_in_five_with_no_near_duplicate_on_the_training_side():
    items = _synthetic()
    split = qs.split_questions(items)
    assert 0.18 < len(split.held_out) / len(items) < 0.22
    assert len(split.training) + len(split.held_out) == len(items)
    assert not {id(q) for q in split.training} & {id(q) for q in split.held_out}
    assert _leaks(split) == []
    trained_passages = {q.gold_id for q in split.training}
    assert not any(q.gold_id in trained_passages for q in split.held_out)


def test_a_split_by_passage_alone_would_leak_so_the_check_can_fail():
    items = _synthetic()
    by_passage = qs.QuestionSplit(training=tuple(q for q in items if q.gold_id % 5),
                                  held_out=tuple(q for q in items if q.gold_id % 5 == 0))
    assert _leaks(by_passage)


def test_split_is_stable_and_independent_of_the_order_and_the_kb():
    items = _synthetic()
    first = qs.split_questions(items)
    shuffled = items[:]
    random.Random(1).shuffle(shuffled)
    assert {q.question for q in qs.split_questions(shuffled).held_out} == {q.question for q in first.held_out}
    # nq-counterfactual stores other passage answers for the same questions and passages
    counterfactual = [KBQuestion(q.question, q.answer, q.swapped_answer, q.swapped_answer, q.gold_id) for q in items]
    assert [q.question for q in qs.split_questions(counterfactual).held_out] == [q.question for q in first.held_out]


def test_example_questions_and_their_group_never_train():
    items = _synthetic(400)
    target = items[10]
    items[10] = _q(target.question, target.answer, target.gold_id, example=True)
    split = qs.split_questions(items)
    group = qs.question_groups(items)
    mates = {items[i].question for i, g in enumerate(group) if g == group[10]}
    assert not mates & {q.question for q in split.training}


def test_eval_questions_are_the_held_out_ones_with_a_passage_answer(tmp_path: Path):
    items = _synthetic(300)
    kb = tmp_path / "kb"
    kb.mkdir()
    with (kb / qs.QUESTIONS_FILE).open("w") as handle:
        for i, q in enumerate(items):
            handle.write(json.dumps({"question": q.question, "answer": q.answer, "swapped_answer": q.swapped_answer,
                                     "passage_answer": "" if i % 7 == 0 else q.passage_answer, "gold_id": q.gold_id}) + "\n")
    evals = qs.load_eval_questions(kb)
    held = {q.question for q in qs.split_questions(qs.load_questions(kb)).held_out}
    assert evals and {e.question for e in evals} <= held
    assert all(e.answer for e in evals) and len(evals) < len(held)
    assert qs.load_eval_questions(tmp_path) == [] and qs.load_eval_questions(None) == []


def test_examples_by_kb_leaves_out_kbs_without_examples(tmp_path: Path):
    def kb(name: str, flags: list[bool]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        with (folder / qs.QUESTIONS_FILE).open("w") as handle:
            for i, flag in enumerate(flags):
                handle.write(json.dumps({"question": f"{name} q{i}", "answer": "a", "swapped_answer": "b",
                                         "passage_answer": "a", "gold_id": i, "example": flag}) + "\n")
        return folder

    own = tmp_path / "own"
    own.mkdir()  # a user's KB: no questions at all
    found = qs.examples_by_kb({"wiki": kb("wiki", [False, True, True]), "quiet": kb("quiet", [False]), "own": own, "none": None})
    assert {name: [q.question for q in items] for name, items in found.items()} == {"wiki": ["wiki q1", "wiki q2"]}


def test_example_questions_read_only_the_flagged_lines(tmp_path: Path):
    """The warm start's shortcut finds every example, even among questions that quote the word, and
    skips the other lines' JSON; reading all questions still finds a malformed one."""
    rows = [
        {"question": 'what does "example" mean', "answer": "a", "swapped_answer": "b", "passage_answer": "a", "gold_id": 0},
        {"question": "who sang it first", "answer": "a", "swapped_answer": "b", "passage_answer": "a", "gold_id": 1,
         "example": True},
        {"question": "what is the example flag", "answer": "a", "swapped_answer": "b", "passage_answer": "a",
         "gold_id": 2, "example": False},
    ]
    lines = [json.dumps(row) for row in rows] + ["{not json", json.dumps({**rows[1], "question": "last", "gold_id": 3}, ensure_ascii=False)]
    (tmp_path / qs.QUESTIONS_FILE).write_text("\n".join(lines) + "\n")
    assert [q.question for q in qs.example_questions(tmp_path)] == ["who sang it first", "last"]
    with pytest.raises(KnowledgeBaseError, match="line 4 is malformed"):
        qs.load_questions(tmp_path)


@pytest.mark.parametrize("line, message", [
    ('{"question": "who?", "answers": "Ada"}', "line 2 needs"),
    ('{"question": "", "answers": ["Ada"]}', "line 2 needs"),
    ('{"question": "who?", "answers": [" "]}', "line 2 gives no answer"),
    ("[" * 100_000 + "]" * 100_000, "line 2 is nested too deeply"),
    ("not json", "line 2 is not valid JSON"),
])
def test_a_malformed_question_file_is_a_message_naming_its_line(tmp_path, line, message):
    from rag_demo.errors import InputError
    from rag_demo.questions import load_question_set

    path = tmp_path / "mine.jsonl"
    path.write_text('{"question": "who wrote hamlet?", "answers": ["Shakespeare"]}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=message):
        load_question_set(path)


def test_a_question_file_loads_in_order(tmp_path):
    from rag_demo.questions import load_question_set

    path = tmp_path / "mine.jsonl"
    path.write_text('{"question": "who wrote hamlet?", "answers": ["Shakespeare", " "]}\n\n'
                    '{"question": "capital of peru?", "answers": ["Lima"], "topic": "geography"}\n', encoding="utf-8")
    assert [(q.question, q.answers, q.topic) for q in load_question_set(path)] == [
        ("who wrote hamlet?", ("Shakespeare",), ""), ("capital of peru?", ("Lima",), "geography")]


def test_no_everyday_question_is_of_a_kind_the_badges_leave_out():
    """The sureness bands were measured on the everyday sets; a kind of question they hold must not lose its badge,
    nor a notice tell a visitor that such a question is beyond the base."""
    from rag_demo.question_kinds import question_notices, unusual_kinds
    from rag_demo.questions import load_question_set

    for name in ("everyday-train", "everyday"):
        flagged = [q.question for q in load_question_set(name) if unusual_kinds(q.question) or question_notices(q.question)]
        assert flagged == [], (name, flagged)


@pytest.mark.parametrize("question", [
    "singer of bohemian rhapsody?", "singapore became independent in which year?", "drawbridge is a type of what?",
    "who directed blade runner 2049?", "who created the game 2048?", "who wrote 2061: odyssey three?",
    "who wrote twelfth night, or what you will?", "who directed dr strangelove or how i learned to stop worrying?",
    "will smith starred in which 1996 alien invasion film?", "do the right thing was directed by whom?",
    "am radio uses which band of frequencies?", "is this love was sung by whom?", "tell me about the eiffel tower",
    "who sang tell me something good?", "which is bigger, the sun or the moon?", "who won the 2018 world cup?",
])
def test_ordinary_questions_a_review_tried_keep_their_badge(question):
    """Titles and trivia that open with a name ("will smith ...", "blade runner 2049") are questions of fact."""
    from rag_demo.question_kinds import question_notices, unusual_kinds

    assert unusual_kinds(question) == () and question_notices(question) == ()


def test_a_recent_year_is_one_up_to_this_year():
    from rag_demo.question_kinds import names_a_recent_year

    assert names_a_recent_year("who won the 2022 world cup?", this_year=2026)
    assert not names_a_recent_year("who won the 2022 world cup?", this_year=2021)
    assert not names_a_recent_year("who won the 2019 world cup?", this_year=2026)


def test_no_everyday_question_is_one_the_prompts_answer_in_a_worked_example():
    """A worked example's question in a set is answered from the prompt, not from the passages or the weights."""
    from rag_demo.generation import prompts

    asked = {qs.normalize_answer(q) for q in [*(e[2] for e in prompts.EXAMPLES), *dict(prompts.CLOSED_BOOK_EXAMPLES)]}
    for name in ("everyday-train", "everyday"):
        leaked = [q.question for q in qs.load_question_set(name) if qs.normalize_answer(q.question) in asked]
        assert not leaked, (name, leaked)


@pytest.mark.parametrize("question, by_name", [
    ("who was cleopatra?", True), ("what is a black hole?", True), ("who was joan of arc?", True),
    ("who was alexander the great?", True), ("who were the beatles?", True), ("what's photosynthesis?", True),
    ("who was queen victoria?", True), ("what is covid-19?", True),
    ("what is largest ocean?", False), ("what is biggest planet?", False), ("who was first president?", False),
    ("what is capital of canada?", False), ("who is the king of france?", False), ("who is president?", False),
    ("what is the hardest natural substance?", False), ("what is mount everest height?", False),
])
def test_a_question_asking_what_a_name_is_is_told_from_one_asking_a_relation(question, by_name):
    """A browser review's questions: names with "of" or "the" in them are names; a superlative or a property of
    something, its article dropped as visitors often do, asks a relation and keeps its badge."""
    from rag_demo.question_kinds import ABOUT_A_NAME_NOTE, question_notices, unusual_kinds

    assert ("a question of who or what something is" in unusual_kinds(question)) == by_name
    assert (ABOUT_A_NAME_NOTE in question_notices(question)) == by_name


@pytest.mark.parametrize("question, judgement", [
    ("is pizza better than pasta?", True), ("Are cats nicer than dogs?", True), ("which is better, tea or coffee?", True),
    ("what do you think of jazz?", True), ("what is your favourite film?", True), ("is an electric car worth it?", True),
    ("do you like the beatles?", True),
    ("which metal conducts electricity better than copper?", False), ("who sang better than ever?", False),
    ("what do you call a baby frog?", False), ("which is bigger, the sun or the moon?", False),
    ("who wrote you think you know me?", False),
])
def test_a_question_of_opinion_gets_a_note_that_no_one_gave_this_view(question, judgement):
    """A browser review asked "is pizza better than pasta?" and read an invented fact under only the yes/no notice."""
    from rag_demo.question_kinds import OPINION_NOTE, question_notices, unusual_kinds

    assert ("a question of opinion" in unusual_kinds(question)) == judgement
    assert (OPINION_NOTE in question_notices(question)) == judgement
