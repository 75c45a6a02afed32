"""Tuning the question encoder on questions made from the general base's own leads: does retrieval of
everyday questions improve without a single question written by a person?

    python -m benchmarks.lead_questions --save leads-tuned
    python -m rag_demo eval --kb wikipedia --questions everyday-train --variant token --n 150 --seed 0 --k 5 \\
        --question-encoder leads-tuned --memory-logit 13

Most everyday questions the retriever misses ask for the entity an article is about ("which english king
had six wives?": Henry VIII's lead). Each lead says such things of its subject in its first sentences, so
each of those sentences, its subject replaced by "who" (people) or "what", is a question whose gold
passage is the one holding the sentence: "Henry VIII was King of England ..." becomes "who was King of
England ...?". Wikipedia's short description gives one more ("who is King of England from 1509 to
1547?", the article's first passage). The question side is then tuned as on NQ
(`training.question_encoder.tune_question_encoder`: the gold passage's cross-entropy over every passage
under the hybrid logits, the passage vectors fixed). The table is `benchmarks.general_retrieval`'s
(an answer-bearing passage in the top k) for the packaged question side and the tuned one, on a question
set no question was made from. `--save NAME` keeps the tuned side for `--question-encoder NAME`; memory
has no fitted logit for it, so give the default's.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import time

import numpy as np
import torch

from rag_demo.config import GENERAL_KB, TuningConfig
from rag_demo.questions import load_question_set, normalize_answer

from .general_retrieval import KS, covering_rows, first_hits

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
# A verb that ends a sentence's subject: what comes after it is said of the subject
_VERB = re.compile(r"\b(is|was|are|were|has|had|became|remains|won|wrote|painted|composed|discovered|invented|founded|led)\b")
_PRONOUNS = {"he", "she", "it", "they", "this", "these", "its", "his", "her"}
_WORD = re.compile(r"\w+")


def _shortened(rest: str, max_words: int) -> str:
    """The first words of `rest`: at most `max_words`, or up to a clause mark after at least six."""
    words = []
    for word in rest.split():
        words.append(word)
        if len(words) >= max_words or (len(words) >= 6 and word.endswith((",", ";", ":"))):
            break
    return " ".join(words).rstrip(",;:.")


def lead_questions(articles: dict, titles: list[str], texts: list[str], *, sentences: int = 3, max_words: int = 14,
                   descriptions: bool = True) -> list[tuple[str, int]]:
    """(question, gold row) pairs from the first `sentences` sentences of each lead whose subject names the
    article or is a pronoun, and from each description of three words or more.

    >>> lead_questions({"a": {"title": "Jupiter", "topic": "Physical sciences", "description": "Fifth planet from the Sun",
    ...                       "extract": "Jupiter is the fifth planet from the Sun. It has 95 moons."}},
    ...                ["Jupiter"], ["Jupiter is the fifth planet from the Sun. It has 95 moons."])
    [('what is the fifth planet from the Sun?', 0), ('what has 95 moons?', 0), ('what is fifth planet from the Sun?', 0)]
    """
    rows_by_title: dict[str, list[int]] = {}
    for row, title in enumerate(titles):
        rows_by_title.setdefault(title, []).append(row)
    pairs = []
    for article in articles.values():
        rows = rows_by_title.get(article["title"])
        if not rows:
            continue
        wh = "who" if article.get("topic") == "People" else "what"
        title_words = {w.lower() for w in _WORD.findall(article["title"]) if len(w) > 2}
        for sentence in _SENTENCE_END.split(article["extract"].strip())[:sentences]:
            verb = _VERB.search(sentence)
            if not verb or verb.start() == 0 or verb.start() > 80:
                continue
            subject = {w.lower() for w in _WORD.findall(sentence[:verb.start()])}
            if not subject & (title_words | _PRONOUNS):
                continue
            question = f"{wh} {_shortened(sentence[verb.start():], max_words)}?"
            if len(question.split()) >= 4:
                pairs.append((question, next((r for r in rows if sentence[:40] in texts[r]), rows[0])))
        description = str(article.get("description", "")).strip()
        if descriptions and len(description.split()) >= 3:
            pairs.append((f"{wh} is {description[0].lower() + description[1:]}?", rows[0]))
    return pairs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", default="everyday-train", help="the question set retrieval is scored on")
    parser.add_argument("--sentences", type=int, default=3, help="sentences of each lead made into questions")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--save", metavar="NAME", help="keep the tuned question side under NAME")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from rag_demo.offline.leads import ensure_leads
    from rag_demo.serving.loading import engine_from_config
    from rag_demo.training.question_encoder import TrainingQuestion, tune_question_encoder

    engine = engine_from_config()
    knowledge = engine.resolve_kb(GENERAL_KB)
    encoder = engine.encoder
    titles, texts = list(knowledge.titles), list(knowledge.texts)
    articles = json.loads(ensure_leads().read_text(encoding="utf-8"))
    pairs = [TrainingQuestion(q, row) for q, row in lead_questions(articles, titles, texts, sentences=args.sentences)]
    print(f"{len(pairs):,} questions from {len(articles):,} leads, e.g. {pairs[0].question!r}")

    questions = load_question_set(args.questions)
    vectors = np.ascontiguousarray(knowledge.embeddings, dtype=np.float32)  # (N, D)
    passages = torch.from_numpy(vectors)
    lexical_index = engine.retriever.lexical_index(knowledge)
    lexical = torch.from_numpy(np.stack([lexical_index.scores(q.question) for q in questions]).astype(np.float32))  # (Q, N)
    normalized = [f" {normalize_answer(t)} " for t in texts]
    covering = [set(covering_rows(texts, normalized, q.answers)) for q in questions]

    def row(name: str, model) -> str:
        q = torch.cat([encoder.encode_questions([x.question for x in questions[i:i + 64]], question_model=model.eval())
                       for i in range(0, len(questions), 64)])  # (Q, D)
        ranks = first_hits(encoder.scale * q @ passages.T + engine.lexical_weight * lexical, covering, max(KS))
        return f"| {name} | " + " | ".join(f"{100 * sum(r is not None and r < k for r in ranks) / len(questions):.1f}"
                                           for k in KS) + " |"

    started = time.perf_counter()
    tuned = tune_question_encoder(encoder, vectors, lexical_index, pairs, lexical_weight=engine.lexical_weight,
                                  config=TuningConfig(epochs=args.epochs, learning_rate=args.learning_rate, question_share=1.0))
    seconds = time.perf_counter() - started
    print(f"\n{args.questions}, {len(questions)} questions; an answer-bearing passage in the top k, Dense + BM25:\n")
    print("| question side | " + " | ".join(f"@{k}" for k in KS) + " |")
    print("|---|" + "---|" * len(KS))
    print(row("packaged", encoder.question_model))
    print(row(f"tuned on the lead questions ({args.epochs} epoch(s), {seconds:.0f} s)", tuned))
    if args.save:
        from rag_demo.serving.retriever_training import save_question_encoder

        folder = save_question_encoder(tuned, args.save, {"trained on": f"{len(pairs)} lead questions",
                                                          "sentences": args.sentences, "epochs": args.epochs})
        print(f"\nsaved as {args.save} ({folder})")


if __name__ == "__main__":
    main()
