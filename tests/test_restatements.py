"""Answers that restate the question are set aside (`generation.restatements`), for every answer the page shows."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import rag_demo.engine as engine_module
from rag_demo.config import DecodingConfig
from rag_demo.generation.decoding import NEG, BarFirstWord
from rag_demo.generation.restatements import first_word_forms, opening_forms, restates_question

QUESTION = "who wrote a farewell to arms"


@pytest.mark.parametrize("question, answer, restates", [
    ("what is the german federal parliament called?", "The German federal parliament", True),
    ("what is the german federal parliament called?", "Bundestag", False),
    ("what comes next in the sequence 2, 4, 8, 16?", "2, 4, 8, 16", True),
    ("what comes next in the sequence 2, 4, 8, 16?", "32", False),
    ("which famous escape artist was born erik weisz?", "Erik Weisz", True),
    ("what is the capital of mexico?", "Mexico City", False),  # one new word is enough
    ("is paris or lyon the capital of france?", "Paris", False),  # a choice: the answer must repeat it
    ("what is the capital of france?", "", False),
    ("what is the capital of france?", "the", False),  # only an article: nothing left to compare
    # a paragraph pasted before the question offers its answer: at 46 words nothing restates, at 40 it may
    (" ".join(["the fire of 1666 burned london"] * 7) + " when did it burn", "1666", False),
    (" ".join(["the fire of 1666 burned london"] * 6) + " when did it burn", "1666", True),
    # or a sentence of its own before the question, however short; an initial ends no sentence
    ("Jumping spiders are spiders in the family Salticidae. What family are jumping spiders in?",
     "the family Salticidae", False),
    ("in which city was president John F. Kennedy assassinated?", "John F. Kennedy", True),
    # a possessive is the same word without its 's
    ("what is the bank of england's nickname?", "the Bank of England", True),
    ("what is the ring of icy bodies beyond neptune called?", "Neptune's ring of icy bodies", True),
    # a sentence that opens with the question's words (another form of them counts) ...
    ("which family of instruments does the oboe belong to?", "the oboe belongs to the family of woodwinds.", True),
    ("what did wilhelm röntgen discover?", "he discovered x-rays in his laboratory", False),  # x-rays: new
    ("what did marie curie discover in 1898?", "Marie Curie discovered polonium and radium", True),
    # ... but not a shorter answer, nor a sentence whose second word is new
    ("which family of instruments does the oboe belong to?", "oboe family woodwind", False),
    ("what is hokusai's famous print of a giant wave called?", "the great wave off Kanagawa", False),
    ("what does opec stand for?", "Organization of the Petroleum Exporting Countries", False),
    # a why or how question is answered with a sentence
    ("why is the sky blue?", "the sky is blue because of the Rayleigh scattering effect.", False),
    ("how do bees make honey?", "bees make honey from nectar", False),
    ("how many legs do spiders have?", "the legs of spiders number eight", True),  # "how many" asks for a number
])
def test_restates_question(question, answer, restates):
    assert restates_question(question, answer) is restates


def test_first_word_forms_are_the_same_word_in_other_spellings(tiny_parts):
    tokenizer = tiny_parts["gen_tok"]
    spaced = tokenizer(" the", add_special_tokens=False).input_ids
    bare = tokenizer("the", add_special_tokens=False).input_ids  # a sentence's first word
    assert len(spaced) == 1 and len(bare) == 1 and spaced != bare
    forms = first_word_forms(tokenizer, spaced[0])
    assert {spaced[0], bare[0]} <= forms
    assert tokenizer(" lazy", add_special_tokens=False).input_ids[0] not in forms


def test_bar_first_word_waits_for_the_forced_start_tokens():
    bar = BarFirstWord(frozenset({5, 7}), prefix_len=1, before=frozenset({0, 2}))
    scores = torch.zeros(3, 10)
    input_ids = torch.tensor([[2, 0], [2, 0], [2, 4]])  # BOS forced: rows 0-1 have no word yet; row 2 has one
    out = bar(input_ids, scores)
    assert (out[:2, [5, 7]] == NEG).all() and (out[:2, [0, 1, 4]] == 0).all()
    assert (out[2] == 0).all()
    assert bar(torch.tensor([[2]]), torch.zeros(1, 10))[0, 5] == NEG  # nothing generated yet
    assert (scores == 0).all()  # the caller's scores are left alone


def _restating(monkeypatch, answers: set[str]) -> None:
    """Make the engine take exactly `answers` for restatements of the question."""
    monkeypatch.setattr(engine_module, "restates_question", lambda question, answer: answer in answers)


def test_a_restating_answer_is_decoded_again_without_its_first_word(causal_engine, monkeypatch):
    gen = causal_engine.generator
    first = causal_engine.ask(QUESTION, k=3, max_new_tokens=4)
    token, closed = first.variants["token"], first.closed_book
    assert token.set_aside == () and closed.set_aside == ()
    _restating(monkeypatch, {token.answer, closed.answer})
    again = causal_engine.ask(QUESTION, k=3, max_new_tokens=4)
    kept, kept_closed = again.variants["token"], again.closed_book
    assert kept.set_aside == (token.answer,) and kept.answer != token.answer
    assert kept_closed.set_aside == (closed.answer,) and kept_closed.answer != closed.answer
    barred = gen.first_word_forms(token.token_ids[0])
    assert kept.token_ids[0] not in barred
    # the same answer as decoding with those tokens kept off the start by the no-answer ban, a separate path
    gen.reads_no_answer = True
    gen.__dict__["_no_answer_first"] = barred
    try:
        monkeypatch.setattr(engine_module, "restates_question", lambda question, answer: False)
        banned = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False)
    finally:
        gen.reads_no_answer = False
        gen.__dict__.pop("_no_answer_first", None)
    assert banned.variants["token"].token_ids == kept.token_ids
    # its probabilities are the model's own, traced as for any answer
    assert sum(kept.token_logprobs) == pytest.approx(kept.logprob, abs=1e-4)


def test_rag_sequence_keeps_its_best_candidate_that_does_not_restate(causal_engine, monkeypatch):
    """A source whose answer restates the question offers the answer it gives next instead (a restating candidate
    is never chosen, and would hide that one), and the restating answer is reported as set aside."""
    first = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False).variants["sequence"]
    assert len(first.candidates) >= 2 and first.answer == first.candidates[0][0]
    restating = first.candidates[0][0]
    _restating(monkeypatch, {restating})
    kept = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False).variants["sequence"]
    assert restating not in dict(kept.candidates) and kept.set_aside == (restating,)
    assert kept.answer == kept.candidates[0][0] and kept.logprob == pytest.approx(kept.candidates[0][1], abs=1e-4)
    others = {text for text, _ in first.candidates[1:]}
    assert others <= set(dict(kept.candidates))  # the other sources' answers stand
    assert len(dict(kept.candidates)) > len(others)  # and the restating sources gave answers of their own


def test_rag_sequence_passes_over_a_candidate_without_words(causal_engine, monkeypatch):
    """A 5,000-character question once got "" from RAG-Sequence: an answer without words is never right where
    another candidate has some, and it is not reported as a restatement either."""
    first = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False).variants["sequence"]
    assert len(first.candidates) >= 2
    decode = causal_engine.generator.decode
    monkeypatch.setattr(causal_engine.generator, "decode",
                        lambda ids, **options: "" if decode(ids, **options) == first.answer else decode(ids, **options))
    kept = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False).variants["sequence"]
    assert kept.answer == first.candidates[1][0] and kept.set_aside == ()
    assert dict(kept.candidates)[""] == pytest.approx(first.candidates[0][1], abs=1e-4)  # still listed, with its score
    config = dataclasses.replace(causal_engine.config, decoding=DecodingConfig(set_aside_restatements=False))
    monkeypatch.setattr(causal_engine, "config", config)
    assert causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False).variants["sequence"].answer == ""  # the paper's choice


def test_memorys_rag_sequence_candidate_is_the_closed_book_answer_when_its_first_restates(causal_engine, monkeypatch):
    """A review saw memory's restating sentence among the candidates while the closed-book card, which sets it
    aside, answered "Tom Brady": memory's candidate and the card must be one answer."""
    from rag_demo.config import MemoryConfig

    monkeypatch.setattr(causal_engine, "config", dataclasses.replace(causal_engine.config, memory=MemoryConfig(logit=0.0)))
    first = causal_engine.ask(QUESTION, k=3, max_new_tokens=4)
    assert first.memory_prob is not None and first.closed_book.answer in dict(first.variants["sequence"].candidates)
    _restating(monkeypatch, {first.closed_book.answer})
    again = causal_engine.ask(QUESTION, k=3, max_new_tokens=4)
    assert again.closed_book.set_aside == (first.closed_book.answer,)
    candidates = dict(again.variants["sequence"].candidates)
    assert again.closed_book.answer in candidates and first.closed_book.answer not in candidates


def test_every_try_restating_keeps_the_first_answer(causal_engine, monkeypatch):
    first = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False).variants["token"]
    monkeypatch.setattr(engine_module, "restates_question", lambda question, answer: True)
    again = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False).variants["token"]
    assert again.answer == first.answer and again.set_aside == ()


def test_switched_off_decodes_as_the_paper(causal_engine, monkeypatch):
    first = causal_engine.ask(QUESTION, k=3, max_new_tokens=4).variants["token"]
    _restating(monkeypatch, {first.answer})
    config = dataclasses.replace(causal_engine.config, decoding=DecodingConfig(set_aside_restatements=False))
    monkeypatch.setattr(causal_engine, "config", config)
    plain = causal_engine.ask(QUESTION, k=3, max_new_tokens=4).variants["token"]
    assert plain.answer == first.answer and plain.set_aside == ()


def test_every_spelling_of_the_first_word_is_barred(causal_engine, monkeypatch):
    first = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False).variants["token"]
    _restating(monkeypatch, {first.answer})
    next_best = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False).variants["token"]
    spellings = frozenset({first.token_ids[0], next_best.token_ids[0]})
    # as if the next best first token were the same word spelled otherwise
    monkeypatch.setattr(causal_engine.generator, "first_word_forms", lambda token_id: spellings)
    kept = causal_engine.ask(QUESTION, k=3, max_new_tokens=4, closed_book=False).variants["token"]
    assert kept.token_ids[0] not in spellings and kept.set_aside == (first.answer,)


def test_a_word_piece_is_barred_alone_and_a_whole_word_in_every_spelling():
    """Asked for Algeria's capital, Gemma restated "algeria" (" al" "ger" "ia"); barring every spelling of " al" barred
    " Al", the start of " Al" "giers", and the answer left was "Algeri". A piece is barred alone."""
    from types import SimpleNamespace

    texts = {0: "<bos>", 1: " al", 2: "ger", 3: "ia", 4: " Paris", 5: ","}
    gen = SimpleNamespace(special_ids=frozenset({0}), token_text=texts.__getitem__,
                          first_word_forms=lambda token_id: frozenset({token_id, 100 + token_id}))
    assert opening_forms((0, 1, 2, 3), gen) == {1}
    assert opening_forms((4, 5), gen) == opening_forms((4,), gen) == {4, 104}
    assert opening_forms((0,), gen) == frozenset()

