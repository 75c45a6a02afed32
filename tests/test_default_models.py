"""The offline default (Gemma-3-270m, all-MiniLM-L6-v2, the NQ knowledge bases) end to end.

These build the real caches on first run (minutes) and reuse them after; they run in CI too.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    from rag_demo.engine import RagEngine

    return RagEngine.from_config()


def _featured(engine, kb):
    from rag_demo.data import load_questions

    return [q for q in load_questions(engine.kbs[kb].path) if q.example]


def test_default_engine_answers_from_the_gold_passage(engine):
    assert engine.kb_names == ("nq-wiki", "nq-counterfactual")
    assert len(engine.example_questions("nq-wiki")) >= 4
    from rag_demo.evaluate import contains_answer

    hits = 0
    featured = _featured(engine, "nq-wiki")[:4]
    for q in featured:
        result = engine.ask(q.question, kb="nq-wiki", k=5, max_new_tokens=12)
        assert abs(sum(p.prob for p in result.passages) - 1) < 1e-4
        hits += contains_answer(result.variants["token"].answer, q.passage_answer)
    assert hits >= len(featured) // 2


def test_swapping_the_index_changes_the_answer(engine):
    from rag_demo.evaluate import contains_answer

    follows = 0
    featured = _featured(engine, "nq-counterfactual")[:4]
    for q in featured:
        result = engine.ask(q.question, kb="nq-counterfactual", k=5, variants=("token",), max_new_tokens=12, closed_book=False)
        follows += contains_answer(result.variants["token"].answer, q.swapped_answer)
    assert follows >= len(featured) // 2


@pytest.mark.parametrize("kb", ["nq-wiki", "nq-counterfactual"])
def test_score_gives_asked_answers_the_probability_ask_showed(engine, kb):
    endings = set()
    for q in _featured(engine, kb)[:3]:
        token = engine.ask(q.question, kb=kb, k=5, variants=("token",), closed_book=False).variants["token"]
        endings.add(token.tokens[-1])
        scored = engine.score(q.question, token.answer, kb=kb, k=5, variants=("token",)).variants["token"]
        assert scored.token_ids == token.token_ids  # the same tokens, the same ending
        assert scored.logprob == pytest.approx(token.logprob, abs=1e-3)
    assert endings <= {"\n\n", "\n"}


def test_eval_command_reports_metrics(engine):
    from rag_demo.evaluate import evaluate

    report = evaluate(engine, kb="nq-wiki", variant="token", n=4, seed=1, k=3, max_new_tokens=10)
    assert report["n"] == 4
    for key in ("exact_match", "f1", "answer_recall", "retrieval_recall"):
        assert 0.0 <= report[key] <= 1.0


def test_generator_tokenizer_without_its_construction_tables_encodes_as_loaded(engine):
    from transformers import AutoTokenizer

    tokenizer = engine.generator.tokenizer
    assert tokenizer._vocab is None and tokenizer._merges is None  # the ~140 MB of Python copies are gone
    fresh = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    assert fresh._merges  # a plain load keeps them, so the check above means something
    for text in ("who played john coffey in the green mile?", "Ça va — 東京 🙂 <start_of_turn>user\n",
                 "Answer: Michael Clarke Duncan\n"):
        ids = tokenizer(text)["input_ids"]
        assert ids == fresh(text)["input_ids"]
        assert tokenizer.decode(ids) == fresh.decode(ids)
    assert len(tokenizer) == len(fresh) and tokenizer.get_vocab() == fresh.get_vocab()
