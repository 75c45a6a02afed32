"""The offline default (Gemma-3-270m, all-MiniLM-L6-v2, the NQ knowledge bases) end to end.

These build the real caches on first run (minutes) and reuse them after; they run in CI too.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    from rag_demo.serving.loading import engine_from_config

    return engine_from_config()


def _featured(engine, kb):
    from rag_demo.questions import example_questions

    if kb not in engine.kb_names:
        pytest.skip(f"{kb} is not built here (BIG-bench's task could not be fetched)")
    return example_questions(engine.kbs[kb].path)


def test_the_default_engine_opens_on_wikipedia(engine):
    assert engine.kb_names[:2] == ("wikipedia", "wikipedia-counterfactual") and engine.default_kb == "wikipedia"
    assert set(engine.kb_names) <= {"wikipedia", "wikipedia-counterfactual", "nq-wiki", "nq-counterfactual"}


@pytest.mark.parametrize("kb", ["wikipedia", "nq-wiki"])
def test_default_engine_answers_from_the_gold_passage(engine, kb):
    from rag_demo.evaluate import contains_answer

    featured = _featured(engine, kb)[:4]
    assert len(engine.example_questions(kb)) >= 4
    hits = 0
    for q in featured:
        result = engine.ask(q.question, kb=kb, k=5, max_new_tokens=12, memory=False)
        assert abs(sum(p.prob for p in result.passages) - 1) < 1e-4
        hits += contains_answer(result.variants["token"].answer, q.passage_answer)
    assert hits >= len(featured) // 2


@pytest.mark.parametrize("kb", ["wikipedia-counterfactual", "nq-counterfactual"])
def test_swapping_the_index_changes_the_answer(engine, kb):
    from rag_demo.evaluate import contains_answer

    follows = 0
    featured = _featured(engine, kb)[:4]
    assert featured and all(q.swapped_answer and q.swapped_answer != q.answer for q in featured)
    for q in featured:
        result = engine.ask(q.question, kb=kb, k=5, variants=("token",), max_new_tokens=12, closed_book=False, memory=False)
        follows += contains_answer(result.variants["token"].answer, q.passage_answer)
    assert follows >= len(featured) // 2


@pytest.mark.parametrize("kb", ["wikipedia", "nq-wiki", "nq-counterfactual"])
def test_score_gives_asked_answers_the_probability_ask_showed(engine, kb):
    endings = set()
    for q in _featured(engine, kb)[:3]:
        token = engine.ask(q.question, kb=kb, k=5, variants=("token",), closed_book=False).variants["token"]
        endings.add(token.tokens[-1])
        scored = engine.score(q.question, token.answer, kb=kb, k=5, variants=("token",)).variants["token"]
        assert scored.token_ids == token.token_ids  # the same tokens, the same ending
        assert scored.logprob == pytest.approx(token.logprob, abs=1e-3)
    assert endings <= {"\n\n", "\n"}


def test_eval_on_wikipedia_asks_the_everyday_questions_and_counts_what_it_saw(engine, monkeypatch):
    from rag_demo.evaluate import evaluate, exact_match, sample_questions
    from rag_demo.questions import answer_in_text, set_eval_questions

    asked = []
    ask = engine.ask
    monkeypatch.setattr(engine, "ask", lambda question, **options: asked.append(question) or ask(question, **options))
    report = evaluate(engine, kb="wikipedia", variant="token", n=4, seed=1, k=3, max_new_tokens=10)
    items = sample_questions(set_eval_questions("everyday"), 4, 1)  # the evaluation set, never the training one
    assert report["n"] == 4 and asked == [item.question for item in items]
    monkeypatch.undo()
    results = [engine.ask(item.question, kb="wikipedia", k=3, variants=("token",), max_new_tokens=10, num_beams=1,
                          extractive=False, closed_book=False) for item in items]
    right = [any(exact_match(r.variants["token"].answer, a) for a in item.answers) for r, item in zip(results, items)]
    assert report["exact_match"] == sum(right) / 4
    holds = [any(answer_in_text(p.text, item.answers) for p in r.passages) for r, item in zip(results, items)]
    assert report["retrieval_recall"] == sum(holds) / 4


def test_eval_asks_held_out_questions_and_counts_what_it_saw(engine, monkeypatch):
    from rag_demo.evaluate import evaluate, exact_match, f1_score, sample_questions
    from rag_demo.questions import load_eval_questions, load_questions, split_questions

    _featured(engine, "nq-wiki")
    asked = []
    ask = engine.ask
    monkeypatch.setattr(engine, "ask", lambda question, **options: asked.append(question) or ask(question, **options))
    report = evaluate(engine, kb="nq-wiki", variant="token", n=4, seed=1, k=3, max_new_tokens=10)
    path = engine.kbs["nq-wiki"].path
    split = split_questions(load_questions(path))
    held, trained = {q.question for q in split.held_out}, {q.question for q in split.training}
    assert report["n"] == len(asked) == 4 and all(q in held and q not in trained for q in asked)
    items = sample_questions(load_eval_questions(path), 4, 1)  # the records eval drew, gold rows included
    assert [item.question for item in items] == asked
    monkeypatch.undo()
    # each question asked again as eval asked it: the report's numbers are these answers' scores
    results = [engine.ask(item.question, kb="nq-wiki", k=3, variants=("token",), max_new_tokens=10, num_beams=1,
                          extractive=False, closed_book=False) for item in items]
    answers = [r.variants["token"].answer for r in results]
    assert report["exact_match"] == sum(exact_match(a, item.answer) for a, item in zip(answers, items)) / 4
    assert report["f1"] == pytest.approx(sum(f1_score(a, item.answer) for a, item in zip(answers, items)) / 4)
    assert report["retrieval_recall"] == sum(any(p.id == item.gold_id for p in r.passages) for r, item in zip(results, items)) / 4


def test_closed_book_is_the_base_generators_memory(engine):
    """On 30 held-out questions the page's closed-book answers are the untuned generator's, and no
    one answer covers more than a quarter of them (a reader trained only on passages copied the
    prompt's worked examples instead)."""
    import random
    from collections import Counter

    from rag_demo.config import GeneratorConfig
    from rag_demo.offline.prepare import prepare
    from rag_demo.evaluate import normalize_answer
    from rag_demo.generation.generator import load_generator
    from rag_demo.questions import set_eval_questions

    assert engine.generator.has_adapter == ("nq-wiki" in engine.kb_names)  # the reading adapter learns from nq-wiki
    questions = random.Random(4).sample(set_eval_questions("everyday"), 30)
    page = [engine.closed_book(q.question).answer for q in questions]
    untuned_generator = load_generator(GeneratorConfig(tuned=False), path=str(prepare().generator_path))
    reader = engine.generator
    try:
        engine.generator = untuned_generator
        untuned = [engine.closed_book(q.question).answer for q in questions]
    finally:
        engine.generator = reader
    assert page == untuned
    (_, most), = Counter(normalize_answer(a) for a in page).most_common(1)
    assert most <= len(page) / 4


def test_generator_tokenizer_built_directly_encodes_as_gemmas_own(engine):
    from transformers import AutoTokenizer

    from rag_demo.generation.generator import drop_construction_tables

    tokenizer = engine.generator.tokenizer
    assert type(tokenizer).__name__ == "TokenizersBackend"  # the direct build (`generator.load_tokenizer`)
    assert getattr(tokenizer, "_vocab", None) is None and getattr(tokenizer, "_merges", None) is None  # no Python copies
    fresh = AutoTokenizer.from_pretrained(tokenizer.name_or_path)  # Gemma's own tokenizer class
    assert type(fresh).__name__ != type(tokenizer).__name__ and fresh._merges  # so the comparison means something
    for text in ("who played john coffey in the green mile?", "Ça va — 東京 🙂 <start_of_turn>user\n",
                 "Answer: Michael Clarke Duncan\n", "  two  spaces\n\n\nand (no answer) <bos><eos><pad>", ""):
        for special in (True, False):
            ids = tokenizer(text, add_special_tokens=special)["input_ids"]
            assert ids == fresh(text, add_special_tokens=special)["input_ids"]
            assert tokenizer.decode(ids) == fresh.decode(ids)
            assert tokenizer.decode(ids, skip_special_tokens=True) == fresh.decode(ids, skip_special_tokens=True)
    assert len(tokenizer) == len(fresh) and tokenizer.get_vocab() == fresh.get_vocab()
    assert tokenizer.all_special_ids == fresh.all_special_ids and tokenizer.pad_token_id == fresh.pad_token_id
    drop_construction_tables(fresh)
    assert fresh._vocab is None and fresh._merges is None  # what a load through AutoTokenizer is left with


def test_memory_in_the_passages_batch_answers_as_memory_stepped_apart(engine, monkeypatch):
    """Gemma-3's sliding layers included: the joined batch (`decode_state.join_rows`) gives the same
    answers, probabilities and posteriors as memory's row stepped on its own."""
    from rag_demo import engine as engine_module
    from rag_demo.questions import load_question_set

    if engine.memory_logit() is None:
        pytest.skip("memory is no source of this build (a reading adapter or the fine-tuned question side)")
    questions = [q.question for q in load_question_set("everyday-train")[:4]]
    together = [engine.ask(q, k=5) for q in questions]
    monkeypatch.setattr(engine_module, "join_rows", lambda *states: None)
    apart = [engine.ask(q, k=5) for q in questions]
    for a, b in zip(together, apart):
        assert a.memory_prob == pytest.approx(b.memory_prob, abs=1e-6)
        for name in a.variants:
            x, y = a.variants[name], b.variants[name]
            assert x.token_ids == y.token_ids and x.logprob == pytest.approx(y.logprob, abs=2e-3)
            assert list(x.memory_posteriors) == pytest.approx(list(y.memory_posteriors), abs=2e-3)


def test_no_worked_example_but_the_swapped_one_has_an_article_in_the_general_base(engine):
    """An example whose article the page can retrieve gets copied (`prompts`' docstring); the Magic Flute's is
    there on purpose, its passage naming the real composer."""
    from rag_demo.generation import prompts

    titles = {title.casefold() for title in engine.kbs["wikipedia"].titles}
    assert [title for title, *_ in prompts.EXAMPLES if title.casefold() in titles] == ["The Magic Flute"]


def test_a_restated_word_piece_leaves_other_words_that_begin_alike(engine):
    """"what is the capital of algeria?" was answered "Algeri": the restated "algeria" opens with the piece " al",
    whose spelling " Al" opens "Algiers"."""
    from rag_demo.generation.restatements import opening_forms

    gen = engine.generator
    algeria = tuple(gen.tokenizer(" algeria", add_special_tokens=False).input_ids)
    algiers = gen.tokenizer(" Algiers", add_special_tokens=False).input_ids[0]
    assert len(algeria) > 1 and algiers in gen.first_word_forms(algeria[0])
    assert opening_forms(algeria, gen) == {algeria[0]}
    answer = engine.ask("what is the capital of algeria?", kb="wikipedia", variants=("token",)).variants["token"]
    assert answer.answer == "Algiers" and answer.set_aside


def test_an_answer_restating_the_question_is_set_aside(engine):
    """Gemma answers "what fruit are raisins made from?" with "raisins" from the passages; decoding sets
    it aside and the answer that stays names something the question does not."""
    from rag_demo.generation.restatements import restates_question

    question = "what fruit are raisins made from?"
    result = engine.ask(question, kb="wikipedia", variants=("token",))
    token = result.variants["token"]
    assert token.set_aside and all(restates_question(question, text) for text in token.set_aside)
    assert token.answer.strip() and not restates_question(question, token.answer)
    assert token.token_ids[0] not in engine.generator.first_word_forms(
        engine.generator.answer_target(token.set_aside[0]).ids[0])
