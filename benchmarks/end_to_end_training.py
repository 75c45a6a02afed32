"""The question encoder trained three ways, at equal steps, measured on held-out questions (docs/training.md).

    python -m benchmarks.end_to_end_training --questions 100 --steps 60 --em 100 --seed 0

On the page's default base (wikipedia, Dense + BM25, the generator's memory off: the paper's formulas), from
the packaged question encoder:

    packaged       no training
    gold-passage   the cross-entropy of a pseudo-gold passage over the whole base (the best-ranked candidate
                   that contains an answer: wikipedia has no passage labels), the loss the project used before
    rag-token      −Σ_t log Σ_z p(z|x) p(y_t|x,z,y<t) over each question's top k candidates, from answers alone
    rag-sequence   −log Σ_z p(z|x) p(y|x,z), the same way

Training questions: a seeded draw of `--questions` from everyday-train, each read once with its top 10
candidates under the packaged encoder (the reads are cached: a second run reads nothing; `--time-reads`
reads a few again to time it). Held out: everyday (the evaluation set, never trained on): recall@1/5/20
of a passage that contains an answer, in the top k of the whole base; the mean p(z|x) the top 5 give
such passages; and end-to-end RAG-Token exact match (greedy, k = 5) on a seeded `--em` of them. 95% Wilson
intervals. Every objective takes the same steps on the same batches' schedule; seconds are measured.

`--widen-every N` adds RAG-Token with its candidates widened every N steps (`EndToEndTrainer.widen`): each
question's top 10 over the whole base under the encoder as it learns join its candidates, and only passages
never read for that question are read (cached too). The same steps and batches; the reading is timed apart
from the steps and counted.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import replace


from rag_demo.config import GENERAL_KB, EncoderConfig, EndToEndConfig, EngineConfig, MemoryConfig
from rag_demo.evaluate import evaluate, wilson_interval

log = logging.getLogger(__name__)

OBJECTIVES = ("gold-passage", "rag-token", "rag-sequence")


def read_timing(engine, pairs, *, candidates: int) -> dict:
    """Seconds to read a question's candidates with the generator, fresh (no cache): the one-off cost per question."""
    from rag_demo.serving.retriever_training import engine_reader

    kb = engine.resolve_kb(GENERAL_KB)
    read = engine_reader(engine, kb)
    seconds = []
    for question, answers in pairs:
        rows = [p.id for p in engine.retrieve(question, kb=kb, k=candidates).passages]
        started = time.perf_counter()
        read(question, answers[0], rows)
        seconds.append(time.perf_counter() - started)
    return {"questions": len(seconds), "seconds_per_question": sum(seconds) / len(seconds),
            "seconds_per_passage": sum(seconds) / len(seconds) / candidates}


def sweep(engine, data, pairs, *, validation: int, learning_rates, ks, steps: int, seed: int) -> list[dict]:
    """Each (objective, learning rate, k) trained on all but the last `validation` training questions and measured on
    those (training questions, never the held-out set): how the defaults can be chosen without touching it."""
    from rag_demo.training.end_to_end import EndToEndTrainer, HeldOutCheck

    import numpy as np

    kb = data.kb
    fit, check_on = data.examples[:-validation], data.examples[-validation:]
    bm25 = engine.retriever.lexical_index(kb)

    check = HeldOutCheck(engine.encoder, kb.embeddings, pairs[len(fit):len(data.examples)],
                         np.stack([bm25.scores(e.question) for e in check_on]), lambda row: kb.texts[row],
                         lexical_weight=data.lexical_weight)
    rows = [{"objective": "packaged", **check.measure(engine.encoder.question_model).to_json()}]
    for objective in OBJECTIVES:
        for lr in learning_rates:
            for k in ks if objective != "gold-passage" else ks[:1]:
                config = EndToEndConfig(objective=objective, steps=steps, learning_rate=lr, k=k, seed=seed)
                trainer = EndToEndTrainer(engine.encoder, kb.embeddings, fit, lexical_weight=data.lexical_weight,
                                          config=config, kb_lexical=data.kb_lexical)
                for _ in range(steps):
                    trainer.step()
                rows.append({"objective": objective, "learning_rate": lr, "k": k, "steps": steps,
                             **check.measure(trainer.model).to_json()})
                print(rows[-1], file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=100, help="training questions (a seeded draw of everyday-train)")
    parser.add_argument("--steps", type=int, default=EndToEndConfig().steps)
    parser.add_argument("--em", type=int, default=100, help="held-out questions asked end to end (0: none)")
    parser.add_argument("--time-reads", type=int, default=3, help="training questions read again, uncached, to time it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--widen-every", type=int, default=0, metavar="N",
                        help="also train RAG-Token widening its candidates every N steps (0: not)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--sweep", type=int, default=0, metavar="N",
                        help="instead: a learning rate and k sweep, validated on the last N training questions")
    parser.add_argument("--sweep-lrs", default="1e-5,3e-5,1e-4")
    parser.add_argument("--sweep-ks", default="5,10")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from rag_demo.progress import ConsoleProgress
    from rag_demo.serving.loading import engine_from_config
    from rag_demo.serving.retriever_training import prepare_training, training_pairs
    from rag_demo.training.end_to_end import EndToEndTrainer

    engine = engine_from_config(EngineConfig(encoder=EncoderConfig(tuned=False), memory=MemoryConfig(enabled=False)),
                                progress=ConsoleProgress())
    train, held = training_pairs(GENERAL_KB, None, None)
    train = train[: args.questions]
    data = prepare_training(engine, kb=GENERAL_KB, pairs=train, held_out=held, progress=ConsoleProgress())
    if args.sweep:
        rows = sweep(engine, data, train, validation=args.sweep, steps=args.steps, seed=args.seed,
                     learning_rates=[float(x) for x in args.sweep_lrs.split(",")],
                     ks=[int(x) for x in args.sweep_ks.split(",")])
        print(json.dumps(rows))
        return 0
    reads = read_timing(engine, train[: args.time_reads], candidates=EndToEndConfig().candidates) if args.time_reads else None
    packaged = engine.encoder
    models = {"packaged": (packaged.question_model, None)}
    runs = [(objective, EndToEndConfig(objective=objective, steps=args.steps, seed=args.seed, widen_every=0))
            for objective in OBJECTIVES]
    if args.widen_every:
        runs.append((f"rag-token, widened every {args.widen_every}",
                     EndToEndConfig(objective="rag-token", steps=args.steps, seed=args.seed, widen_every=args.widen_every)))
    for name, config in runs:
        trainer = EndToEndTrainer(packaged, data.kb.embeddings, data.examples, lexical_weight=data.lexical_weight,
                                  config=config, kb_lexical=data.kb_lexical, reading=data.reading)
        seconds, losses = 0.0, []
        for _ in range(config.steps):
            if trainer.widening_due:
                widening = trainer.widen(progress=ConsoleProgress())
                print(f"{name}: widened at step {widening.step}: {widening.added} candidates added, {widening.read} "
                      f"passages read in {widening.seconds:.0f} s", file=sys.stderr)
            started = time.perf_counter()
            losses.append(trainer.step())
            seconds += time.perf_counter() - started
        trained = {"steps": config.steps, "seconds": seconds, "training_questions": len(trainer.examples),
                   "first_loss": losses[0], "last_loss": losses[-1]}
        if trainer.widenings:
            trained |= {"widenings": [w.__dict__ for w in trainer.widenings],
                        "candidates_added": sum(w.added for w in trainer.widenings),
                        "passages_read": sum(w.read for w in trainer.widenings),
                        "widen_seconds": sum(w.seconds for w in trainer.widenings),
                        "mean_candidates": sum(len(e.rows) for e in trainer.examples) / len(trainer.examples)}
        models[name] = (trainer.model.eval(), trained)
        print(f"{name}: {config.steps} steps in {seconds:.1f} s", file=sys.stderr)
    rows = []
    for name, (model, trained) in models.items():
        figures = data.check.measure(model)
        row = {"encoder": name, **(trained or {}), "answer_mass": figures.answer_mass, "held_out": figures.questions}
        for k in (1, 5, 20):
            row[f"recall@{k}"] = figures.recall[k]
            row[f"recall@{k}_interval"] = wilson_interval(figures.hits[k], figures.questions)
        if args.em:
            engine.retriever.encoder = replace(packaged, question_model=model)  # the same engine, this question side
            report = evaluate(engine, kb=GENERAL_KB, variant="token", n=args.em, seed=args.seed, k=5, memory=False,
                              progress=ConsoleProgress())
            row |= {"exact_match": report["exact_match"], "exact_match_interval": report["intervals"]["exact_match"],
                    "em_n": report["n"], "em_seconds_per_question": report["seconds_per_question"]}
        rows.append(row)
    engine.retriever.encoder = packaged
    if args.json:
        print(json.dumps({"rows": rows, "reads": reads, "read_seconds": data.read_seconds,
                          "training_questions": len(data.examples)}))
        return 0
    pct = lambda x: f"{100 * x:.1f}"  # noqa: E731
    ci = lambda pair: f"{100 * pair[0]:.1f}-{100 * pair[1]:.1f}"  # noqa: E731
    print(f"training questions: {len(data.examples)} (everyday-train, seed 0), held out: {rows[0]['held_out']} (everyday)")
    if reads:
        print(f"reading a question's {EndToEndConfig().candidates} candidates, fresh: {reads['seconds_per_question']:.2f} s "
              f"({reads['seconds_per_passage']:.2f} s a passage), over {reads['questions']} questions")
    print("| encoder | steps | s/step | recall@1 (95% CI) | recall@5 (95% CI) | recall@20 (95% CI) | answer mass | "
          "RAG-Token EM (95% CI) |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        steps = f"{row['steps']}" if "steps" in row else "-"
        per_step = f"{row['seconds'] / row['steps']:.2f}" if "steps" in row else "-"
        em = f"{pct(row['exact_match'])} ({ci(row['exact_match_interval'])}), n={row['em_n']}" if "exact_match" in row else "-"
        print(f"| {row['encoder']} | {steps} | {per_step} | " + " | ".join(
            f"{pct(row[f'recall@{k}'])} ({ci(row[f'recall@{k}_interval'])})" for k in (1, 5, 20))
              + f" | {pct(row['answer_mass'])} | {em} |")
    for row in rows:
        if "widenings" in row:
            print(f"{row['encoder']}: {len(row['widenings'])} widenings added {row['candidates_added']} candidates "
                  f"({row['mean_candidates']:.1f} a question at the end), reading {row['passages_read']} new passages in "
                  f"{row['widen_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
