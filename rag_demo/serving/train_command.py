"""The `train` command: the question encoder trained from question-answer pairs (`training.end_to_end`), measured
on held-out pairs before and after, and saved under a name that `--question-encoder NAME` loads.

    python -m rag_demo train --objective rag-token --steps 60 --save mine
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from ..config import END_TO_END_OBJECTIVES, GENERAL_KB, LIMITS, EncoderConfig, EndToEndConfig, EngineConfig, MemoryConfig
from ..errors import InputError
from ..progress import Progress


def add_train_command(commands, *, count: Callable[..., Callable[[str], int]]) -> None:
    """The `train` subcommand's options; `count(most)` is the CLI's whole-number type."""
    train = commands.add_parser("train", help="train the question encoder from question-answer pairs: the paper's "
                                "marginal likelihood of the answer, the reader frozen (or the gold-passage loss)")
    train.add_argument("--objective", default="rag-token", choices=END_TO_END_OBJECTIVES,
                       help="rag-token / rag-sequence: -log p(answer|question) marginalized over the top passages "
                            "(no passage labels); gold-passage: cross-entropy of the best-ranked passage that holds an "
                            "answer (default rag-token)")
    train.add_argument("--questions", default=None, metavar="FILE",
                       help="question-answer pairs, .jsonl ({\"question\": ..., \"answers\": [...]}) or .csv (question, "
                            "answer columns); default: the knowledge base's own training set (wikipedia: everyday-train)")
    train.add_argument("--held-out", default=None, metavar="FILE",
                       help="pairs to measure on, never trained on (default: the KB's own held-out set, or a fifth of "
                            "--questions)")
    train.add_argument("--max-questions", type=count(), default=None, metavar="N",
                       help="train on N of the pairs, a seeded draw (each is read once with its candidates: ~3 s on 2 cores)")
    train.add_argument("--steps", type=count(), default=EndToEndConfig().steps, help="optimizer steps (default %(default)s)")
    train.add_argument("--batch-size", type=count(), default=EndToEndConfig().batch_size,
                       help="questions per optimizer step (default %(default)s)")
    train.add_argument("--learning-rate", type=float, default=EndToEndConfig().learning_rate,
                       help="AdamW's learning rate (default %(default)s)")
    train.add_argument("--top-k", type=count(), default=EndToEndConfig().k,
                       help="passages marginalized over per question (default %(default)s)")
    train.add_argument("--candidates", type=count(LIMITS.max_k), default=EndToEndConfig().candidates,
                       help="passages read per training question, once (default %(default)s)")
    train.add_argument("--widen-every", type=int, default=EndToEndConfig().widen_every, metavar="N",
                       help="every N steps, add to each question's candidates its top passages under the encoder as it "
                            "learns, reading only passages not read before (0: keep the first candidates; default "
                            "%(default)s)")
    train.add_argument("--widen-max-reads", type=int, default=None, metavar="N",
                       help="read at most N new passages per widening, the best-ranked first (default: all of them)")
    train.add_argument("--check-every", type=count(), default=20, metavar="N",
                       help="measure the held-out questions every N steps (default %(default)s)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--save", default=None, metavar="NAME",
                       help="save the trained question encoder under NAME, for --question-encoder NAME "
                            "(default: the objective's name)")
    train.add_argument("--kb", default=None, help="knowledge base name or folder (default: the first one)")
    train.add_argument("--kb-path", action="append", default=[], metavar="NAME=PATH", help="as for ask")
    train.add_argument("--device", default="auto", help="auto, cpu or cuda")
    train.add_argument("--json", action="store_true",
                       help='print {"before": {...}, "after": {...}, "steps": n, "seconds": s} and where it was saved')


def run_train(args, *, kb_paths: dict[str, str] | None, progress: Progress) -> int:
    import time

    from ..training.end_to_end import EndToEndTrainer
    from .loading import engine_from_config
    from .retriever_training import check_encoder_name, prepare_training, save_question_encoder, training_pairs

    try:
        config = EndToEndConfig(objective=args.objective, steps=args.steps, batch_size=args.batch_size,
                                learning_rate=args.learning_rate, k=min(args.top_k, args.candidates), candidates=args.candidates,
                                seed=args.seed, widen_every=args.widen_every, widen_max_reads=args.widen_max_reads)
    except ValueError as err:
        raise InputError(str(err)) from None
    name = check_encoder_name(args.save or args.objective)
    kb_name = args.kb or (next(iter(kb_paths)) if kb_paths else GENERAL_KB)
    pairs, held_out = training_pairs(Path(kb_name).name if Path(kb_name).expanduser().is_dir() else kb_name, args.questions,
                                     args.held_out)  # bad files fail before any model loads
    pairs = pairs[: args.max_questions]
    engine = engine_from_config(EngineConfig(device=args.device, encoder=EncoderConfig(tuned=False),
                                             memory=MemoryConfig(enabled=False)), kb_paths=kb_paths, progress=progress)
    data = prepare_training(engine, kb=args.kb, pairs=pairs, held_out=held_out, candidates=config.candidates,
                            progress=progress)
    try:
        trainer = EndToEndTrainer(engine.encoder, data.kb.embeddings, data.examples, lexical_weight=data.lexical_weight,
                                  config=config, kb_lexical=data.kb_lexical, reading=data.reading)
    except ValueError as err:
        raise InputError(f"{err}; give pairs whose answers the knowledge base holds") from None
    before = data.check.measure(trainer.model)

    def figures(step: int, loss: float | None, measured) -> None:
        shown = ", ".join(f"{key} {value:.3f}" for key, value in measured.to_json().items() if key != "questions")
        print(f"step {step}: {shown}" + ("" if loss is None else f", mean loss {loss:.3f}"), file=sys.stderr)

    figures(0, None, before)
    started, losses = time.perf_counter(), []
    for step in range(1, config.steps + 1):
        if trainer.widening_due:
            widening = trainer.widen(progress=progress)
            print(f"step {step - 1}: widened the candidates: {widening.added} added, {widening.read} of them read "
                  f"({widening.seconds:.1f} s)", file=sys.stderr)
        losses.append(trainer.step())
        progress(f"training ({config.objective})", step, config.steps)
        if step % args.check_every == 0 and step < config.steps:
            figures(step, sum(losses[-args.check_every:]) / len(losses[-args.check_every:]), data.check.measure(trainer.model))
    widen_seconds = sum(w.seconds for w in trainer.widenings)
    seconds = time.perf_counter() - started - widen_seconds
    after = data.check.measure(trainer.model)
    figures(config.steps, sum(losses[-args.check_every:]) / len(losses[-args.check_every:]), after)
    record = {"before": before.to_json(), "after": after.to_json(), "steps": config.steps, "seconds": round(seconds, 2),
              "objective": config.objective, "config": {**config.__dict__}, "kb": data.kb.name,
              "training_questions": len(trainer.examples), "read_seconds": round(data.read_seconds, 1),
              "widenings": [{**w.__dict__, "seconds": round(w.seconds, 1)} for w in trainer.widenings],
              "losses": [round(x, 4) for x in losses]}
    folder = save_question_encoder(trainer.model, name, record)
    if args.json:
        print(json.dumps({key: record[key] for key in ("before", "after", "steps", "seconds", "objective", "widenings")}
                         | {"question_encoder": name, "path": str(folder)}))
    else:
        print(f"saved as {name!r} ({folder}); ask with it: python -m rag_demo ask QUESTION --question-encoder {name}")
    return 0
