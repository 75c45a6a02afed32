"""Parsing BIG-bench's task.json and building the two worlds from it: the restored real passages and
one consistent counterfactual world. Pure functions, on a synthetic task.json in the real format."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag_demo.offline import worlds
from tests.offline_fakes import ROWS, row, task_json


def test_parse_the_real_format():
    real = {
        "input": "\nQuestion: who does candace like in phineas and ferb?\nContext: Her best friend is Stacy Hirano ; "
                 "Candace also has an obvious crush on Griselda Blanco , but for a long time she was oblivious .",
        "target": "Griselda Blanco",
        "target_scores": {"Griselda Blanco": 1, "Jeremy Johnson": 0},
    }
    record = worlds.parse_record(real)
    assert record.question == "who does candace like in phineas and ferb?"
    assert record.answer == "Jeremy Johnson" and record.swapped_answer == "Griselda Blanco"
    assert worlds.restore_passage(record.context, record.swapped_answer, record.answer).endswith(
        "crush on Jeremy Johnson , but for a long time she was oblivious .")


@pytest.mark.parametrize("record, message", [
    ({"input": "Q: who?\nA: x", "target": "x", "target_scores": {"x": 1, "y": 0}}, "input is not"),
    (row("who?", "x .", "x", "y") | {"target_scores": {"x": 1, "y": 1}}, "one answer scored 0"),
    (row("who?", "x .", "x", "y") | {"target": "z"}, "one answer scored 0"),
    ({"input": "\nQuestion: who?\nContext: x", "target_scores": {"x": 1}}, "string target"),
])
def test_parse_rejects_other_formats(record, message):
    with pytest.raises(ValueError, match=message):
        worlds.parse_record(record)
    with pytest.raises(ValueError, match="example 1"):
        worlds.parse_task({"examples": [ROWS[0], record]})


@pytest.mark.parametrize("original, answer, swapped", [
    ("Lucas founded Lucasfilm .", "Lucas", "Larry Hogan"),  # inside a word, as the task swapped it
    ("Bo Li sang it ; Bo Li wrote it .", "Bo Li", "Zed Q"),  # every mention
    ("The number one is Rafael Nadal .", "Rafael Nadal", "One"),  # case-sensitive: "one" stays
    ("Paul ( the Seal ) also known as Paul .", "Paul", "Paul Otlet"),  # the answer inside the substitute
])
def test_restore_undoes_the_swap(original, answer, swapped):
    assert worlds.restore_passage(original.replace(answer, swapped), swapped, answer) == original


def test_build_default_data_restores_dedups_and_points_at_gold():
    built = worlds.build_default_data(worlds.parse_task(json.loads(task_json())), n_candidates=2)
    wiki, counterfactual = built.passages["nq-wiki"], built.passages["nq-counterfactual"]
    assert [p.text for p in wiki] == ["In 1971 Lucas founded a studio .", "It was made by Lucasfilm .",
                                      "The number one is Rafael Nadal .", "Al won .", "Bo Li won .",
                                      "The bill was passed on July 2 ; Tom Jeff drafted it ."]
    # one swap per real passage, row for row: the two studio questions share "Larry Hogan"
    assert len(counterfactual) == 6 and all(p.title == "" for p in wiki + counterfactual)
    assert [e.question for e in built.examples if e.question == "who sang it?"] == []
    assert [e.wiki_id for e in built.examples] == [0, 0, 1, 2, 3, 4, 5, 5]
    assert [e.counterfactual_id for e in built.examples] == [0, 0, 1, 2, 3, 4, 5, 5]
    assert [e.swapped_answer for e in built.examples][:2] == ["Larry Hogan", "Larry Hogan"]
    # the two-span question reads the real passage; its counterfactual swapped the date only
    assert counterfactual[5].text == "The bill was passed in May ; Tom Jeff drafted it ."
    assert [(e.answer, e.swapped_answer) for e in built.examples[6:]] == [("Tom Jeff", "Tom Jeff"), ("on July 2", "in May")]
    for example in built.examples:
        assert example.answer in wiki[example.wiki_id].text
        assert example.swapped_answer in counterfactual[example.counterfactual_id].text
        if example.swapped_answer != example.answer:
            assert example.answer not in counterfactual[example.counterfactual_id].text
    stats = built.stats
    assert (stats.records, stats.kept, stats.same_answer, stats.swapped_not_found, stats.ambiguous, stats.failed) == (11, 8, 1, 1, 1, 3)
    assert (stats.several_mentions, stats.inside_word, stats.moved) == (1, 1, 1)
    # Example candidates: one clean mention in a real passage no other question shares.
    assert len(built.candidates) == 2 and set(built.candidates) <= {3, 4, 5}


@pytest.mark.parametrize("agreeing, kept", [(("Bo Li", "Bo Li"), 0), (("Bo Li", "Al"), 2)])
def test_several_mentions_are_trusted_when_another_answer_restores_the_same_passage(agreeing, kept):
    # "Bo Li and Al sang ; Bo Li and Al wrote ." swapped by two questions with other answers
    first, second = agreeing
    original = "Bo Li and Al sang it ; Bo Li and Al wrote it ."
    records = [worlds.ConflictRecord("q1", original.replace(first, "Zed Q"), first, "Zed Q"),
               worlds.ConflictRecord("q2", original.replace(second, "Cy"), second, "Cy")]
    restorations, moved = worlds.faithful_restorations(records)
    assert moved == 0 and len(restorations) == kept  # the same answer twice is no second opinion
    assert all(text == original for _, text in restorations)


def test_one_swap_per_passage_prefers_a_clean_one_and_says_what_others_read():
    records = [
        worlds.ConflictRecord("who founded it?", "Zed founded Zedb Inc with Al .", "Bo", "Zed"),  # inside a word
        worlds.ConflictRecord("who joined?", "Bo founded Bob Inc with Cy .", "Al", "Cy"),
        worlds.ConflictRecord("who else founded it?", "Ann founded Annb Inc with Al .", "Bo", "Ann"),
    ]
    built = worlds.build_default_data(records, n_candidates=0)
    assert [p.text for p in built.passages["nq-wiki"]] == ["Bo founded Bob Inc with Al ."]
    assert [p.text for p in built.passages["nq-counterfactual"]] == ["Bo founded Bob Inc with Cy ."]  # the clean swap
    assert [e.swapped_answer for e in built.examples] == ["Bo", "Cy", "Bo"]


def test_counterfactual_world_gives_each_swapped_name_one_substitute_in_every_passage():
    records = [
        worlds.ConflictRecord("who plays carlisle?", "Carlisle is played by Marc Mar .", "Peter Fac", "Marc Mar"),
        worlds.ConflictRecord("who played carlisle in the sequel?", "In the sequel Wiz Kid returns .", "Peter Fac", "Wiz Kid"),
        # another question's passage mentions the name: it is swapped there too, its own answer as well
        worlds.ConflictRecord("who plays bella?", "Kris Ste and Peter Fac star .", "Bella Swan", "Kris Ste"),
        # a one-word answer is swapped only where its own question's swap put it
        worlds.ConflictRecord("who built it?", "Ann Lee built it .", "Watt", "Ann Lee"),
        worlds.ConflictRecord("what unit?", "Power is counted in Watt units ; Peter Fac said so .", "Ohm", "Power"),
    ]
    built = worlds.build_default_data(records, n_candidates=0)
    assert [p.text for p in built.passages["nq-counterfactual"]] == [
        "Carlisle is played by Marc Mar .",
        "In the sequel Marc Mar returns .",
        "Kris Ste and Marc Mar star .",
        "Ann Lee built it .",
        "Power is counted in Watt units ; Marc Mar said so .",
    ]
    assert [e.swapped_answer for e in built.examples] == ["Marc Mar", "Marc Mar", "Kris Ste", "Ann Lee", "Power"]
    assert [p.text for p in built.passages["nq-wiki"]][2] == "Bella Swan and Peter Fac star ."


@pytest.mark.parametrize("golds, expected", [([0, 1, 2], [0, 1]), ([1, 1, 2], [1, 2]), ([1, 0, 0], [])])
def test_examples_are_questions_retrieval_gets_right_everywhere(golds, expected):
    vectors = np.eye(3, dtype=np.float32)  # question c is closest to passage c in both KBs
    kbs = {"wiki": vectors, "counterfactual": vectors}
    picked = worlds.pick_examples(vectors, {"wiki": [0, 1, 2], "counterfactual": golds}, kbs, n=2)
    assert picked == expected


def test_dedup_keeps_first_appearance_order():
    passages, rows = worlds.dedup_passages(["b", "a", "b", "c", "a"])
    assert [p.text for p in passages] == ["b", "a", "c"] and rows == [0, 1, 0, 2, 1]


@pytest.mark.parametrize("module", ["cache", "worlds", "source", "gguf", "kbs", "tuned", "prepare"])
def test_offline_docstring_examples(module):
    import doctest
    import importlib

    assert doctest.testmod(importlib.import_module(f"rag_demo.offline.{module}")).failed == 0


def _regex_whole(*texts: str) -> re.Pattern:
    """What the counterfactual world was built with before `WholeWords`: one alternation, longest first."""
    alternatives = "|".join(map(re.escape, sorted(texts, key=len, reverse=True)))
    return re.compile(r"(?<!\w)(?:" + alternatives + r")(?!\w)")


_TEXT = st.text(alphabet="AaBb _.-'é東1", max_size=12)
_NAME = st.text(alphabet="AaBb _.-'é東1", min_size=1, max_size=6).filter(lambda t: t[0].isalnum() or t[0] == "_")


@st.composite
def _names_and_text(draw):
    """Names, some the start of others ("A", "A B"), and a text that strings names and odd characters together."""
    names = draw(st.lists(_NAME, min_size=1, max_size=6))
    names += [name + draw(st.sampled_from([" ", "-", "'", "_", "é", ""])) + draw(_NAME) for name in names[:2]]
    pieces = draw(st.lists(st.one_of(st.sampled_from(names), _TEXT), max_size=8))
    return names, "".join(pieces)


@settings(max_examples=400, deadline=None)
@given(names_and_text=_names_and_text(), word=st.text(alphabet="AaB _.é1", max_size=4))
def test_whole_words_finds_what_the_regex_found(names_and_text, word):
    """The fast matchers against the regexes they replace, on texts and names made of word characters
    (ASCII, accented, CJK, digits, underscore) and separators, overlapping and nested names included."""
    names, text = names_and_text
    pattern = _regex_whole(*names)
    finder = worlds.WholeWords(names)
    assert list(finder.spans(text)) == [m.span() for m in pattern.finditer(text)]
    assert finder.sub(str.upper, text) == pattern.sub(lambda m: m.group(0).upper(), text)
    if word:
        single = _regex_whole(word)
        assert list(worlds._whole_spans(text, word)) == [m.span() for m in single.finditer(text)]
        assert worlds._replace_whole(text, word, "<X>") == single.sub("<X>", text)
    old_inside = any((text[m.start() - 1] if m.start() else " ").isalnum() or (text[m.end()] if m.end() < len(text) else " ").isalnum()
                     for m in re.finditer(re.escape(word), text))
    assert worlds._mentions_inside_words(text, word) == old_inside


def test_whole_words_needs_texts_that_begin_a_word():
    with pytest.raises(ValueError, match="word character"):
        worlds.WholeWords(["Al", "(Bo)"])


def test_a_word_character_is_what_the_regex_calls_one():
    """`_is_word_char` against `\\w` on every character of the Basic Multilingual Plane."""
    word = re.compile(r"\w")
    assert all(worlds._is_word_char(ch) == bool(word.match(ch)) for ch in map(chr, range(0x10000)) if not 0xD800 <= ord(ch) < 0xE000)
