"""Reading everyday questions: the base generator against a reading adapter trained on everyday questions.

    python -m benchmarks.everyday_reading --n 150 --seed 0             # adapter on the other 300 training questions
    python -m benchmarks.everyday_reading --n 150 --seed 0 --epochs 2

Without the NQ pair the offline default reads with the base generator. This asks whether the NQ
recipe's reading adapter (`ReaderTuningConfig`: top-half LoRA, one prompt per question) helps when
its training questions are everyday ones read from the general base instead: each training question
is retrieved as the page retrieves it (wikipedia, Dense + BM25, top `--depth`), and the first passage
holding one of its answers as whole words is read in the page's prompt, the target that answer as
the passage writes it. Questions with no such passage are left out.

everyday-train is split with `--seed`: `--n` questions are measured, the rest train the adapter, so
the everyday test set stays untouched. Both readers answer the measured questions with RAG-Token at
k = 5 and memory off (its logit was fitted for the base weights alone). Nothing is cached. Prints
one markdown table.
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import time
from dataclasses import replace

from rag_demo.config import GENERAL_KB, GeneratorConfig, ReaderTuningConfig
from rag_demo.evaluate import evaluate_table
from rag_demo.generation.generator import load_generator
from rag_demo.offline.prepare import prepare
from rag_demo.offline.tuned import reading_example
from rag_demo.questions import answer_in_text, load_question_set, set_eval_questions
from rag_demo.serving.loading import engine_from_config
from rag_demo.training.reader import shared_prefix, tune_reader


def passage_form(text: str, answer: str) -> str:
    """`answer` as `text` writes it (case and all), or as given when the text writes it otherwise.

    >>> passage_form("It flows into lake baikal.", "Lake Baikal")
    'lake baikal'
    """
    found = re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", text, re.IGNORECASE)
    return found.group(0) if found else answer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=150, help="everyday-train questions measured (the rest train)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--depth", type=int, default=20, help="retrieved passages searched for a training target")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    prepared = prepare()
    engine = engine_from_config()
    kb = engine.resolve_kb(GENERAL_KB)
    everyday = list(load_question_set("everyday-train"))
    random.Random(args.seed).shuffle(everyday)
    measured, training = everyday[:args.n], everyday[args.n:]
    if not measured or not training:
        parser.error(f"--n must leave questions on both sides of the split ({len(everyday)} in all)")

    adapter = load_generator(replace(GeneratorConfig(), tuned=False, dtype="float32"), path=str(prepared.generator_path))
    examples = []
    for question in training:
        for passage in engine.retrieve(question.question, kb=GENERAL_KB, k=args.depth).passages:
            answer = answer_in_text(passage.text, question.answers)
            if answer:
                examples.append(reading_example(adapter, kb, question.question, passage.id, passage_form(passage.text, answer)))
                break
    logging.info("%d of %d training questions have an answer in their top %d", len(examples), len(training), args.depth)
    started = time.perf_counter()
    tune_reader(adapter.model, shared_prefix(examples), examples, config=replace(ReaderTuningConfig(), epochs=args.epochs))
    trained_s = time.perf_counter() - started

    measured_set = {q.question for q in measured}
    questions = {GENERAL_KB: [q for q in set_eval_questions("everyday-train") if q.question in measured_set]}
    rows = []
    for label, generator in (("base generator", engine.generator),
                             (f"adapter, {len(examples)} everyday questions, {args.epochs} epoch(s), trained in {trained_s:.0f} s",
                              adapter)):
        engine.generator = generator
        report, = evaluate_table(engine, kbs=(GENERAL_KB,), ks=(5,), n=len(measured), seed=args.seed, variants=("token",),
                                 questions=questions, memory=False)
        low, high = report["intervals"]["exact_match"]
        rows.append(f"| {label} | {report['n']} | {100 * report['exact_match']:.1f} ({100 * low:.1f}-{100 * high:.1f}) |")
        logging.info("%s", rows[-1])
    print(f"\neveryday-train, {len(measured)} held-out questions (seed {args.seed}), {GENERAL_KB}, RAG-Token, k = 5, memory off\n")
    print("| reader | n | exact match, % (95% CI) |")
    print("|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
