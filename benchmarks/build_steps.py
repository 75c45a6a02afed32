"""Settings of a first start's build, each against the one it replaced, side by side in one run.

    python -m benchmarks.build_steps --rounds 2 --every 16 --steps 15 --reader-steps 8
    python -m benchmarks.build_steps --parts reader --reader-steps 8

Embedding: every `--every`th passage of the default KBs in the build's longest-first order (so the
sample has the build's mix of lengths), 16 a batch, cut at 256 tokens and at 128, in turn, each
round in the same order. The question encoder's fine-tune: `--steps` steps of the build's recipe
with each batch through the encoder whole and in 2 and 4 runs of similar length
(`question_encoder.length_groups`), in turn. The reader: its first `--reader-steps` training batches (after
one that warms up), each as one forward and backward with the shared block run through every block
and kept below the adapters (`reader.frozen_bottom`), in turn batch by batch, the losses compared.
A slow spell of the machine thus lands on every setting. Prints one table of seconds and rates.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from benchmarks.speed import table
from rag_demo.config import DEFAULT_LEXICAL_WEIGHT, EngineConfig, TuningConfig
from rag_demo.retrieval.corpus import load_kb
from rag_demo.retrieval.encoders import load_encoder
from rag_demo.retrieval.lexical import LexicalIndex
from rag_demo.offline.prepare import prepare
from rag_demo.offline.source import ensure_source, read_default_data
from rag_demo.offline.tuned import training_split
from rag_demo.questions import load_questions
from rag_demo.training import question_encoder, reader

COLUMNS = ("what", "setting", "seconds", "rate", "ratio to the first row of its kind")
PASSAGE_LENGTHS = (256, 128)
LENGTH_GROUPS = (1, 2, 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.build_steps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each comparison")
    parser.add_argument("--every", type=int, default=16, help="embed every n-th passage of the build's order")
    parser.add_argument("--steps", type=int, default=15, help="question-encoder steps per setting and round")
    parser.add_argument("--reader-steps", type=int, default=8, help="reader batches per setting")
    parser.add_argument("--parts", default="embedding,encoder,reader", help="which comparisons to run")
    args = parser.parse_args(argv)
    parts = {part.strip() for part in args.parts.split(",") if part.strip()}
    if args.rounds < 1 or args.every < 1 or args.steps < 1 or args.reader_steps < 1:
        raise SystemExit("--rounds, --every, --steps and --reader-steps must be at least 1")
    if not parts or not parts <= {"embedding", "encoder", "reader"}:
        raise SystemExit("--parts takes embedding, encoder and reader, comma-separated")
    paths = prepare()
    rows = []
    if parts & {"embedding", "encoder"}:
        rows += _encoder_rows(args, paths, parts)
    if "reader" in parts:
        rows += _reader_rows(args, paths)
    print(f"\nbuild steps, threads {torch.get_num_threads()}\n")
    print(table([dict(zip(COLUMNS, row)) for row in rows], list(COLUMNS)))
    return 0


def _encoder_rows(args, paths, parts: set[str]) -> list[tuple[str, ...]]:
    config = EngineConfig().encoder
    encoder = load_encoder(config)
    data = read_default_data(ensure_source())
    unique = sorted({p for name in data.passages for p in data.passages[name]},
                    key=lambda p: (-len(p.title) - len(p.text), p.title, p.text))  # as `offline.kbs` orders them
    sample = unique[::args.every]
    encoder.encode_passages(sample[:64], batch_size=16)  # warms up
    embedding = {length: [] for length in PASSAGE_LENGTHS}
    for _ in range(args.rounds if "embedding" in parts else 0):
        for length in PASSAGE_LENGTHS:
            cut = replace(encoder, max_length=length)
            started = time.perf_counter()
            cut.encode_passages(sample, batch_size=16, autocast=True)
            embedding[length].append(time.perf_counter() - started)

    wiki = paths.kb_paths["nq-wiki"]
    kb = load_kb(wiki)
    lexical = LexicalIndex.for_passages(kb.titles, kb.texts)
    training, _ = training_split(load_questions(wiki))
    recipe = TuningConfig()
    questions = [question_encoder.TrainingQuestion(q.question, q.gold_id) for q in training][:recipe.batch_size * args.steps]
    steps = {groups: [] for groups in LENGTH_GROUPS}
    built = question_encoder.QUESTION_LENGTH_GROUPS
    try:
        for _ in range(args.rounds if "encoder" in parts else 0):
            for groups in LENGTH_GROUPS:
                question_encoder.QUESTION_LENGTH_GROUPS = groups
                started = time.perf_counter()
                question_encoder.tune_question_encoder(encoder, kb.embeddings, lexical, questions, lexical_weight=DEFAULT_LEXICAL_WEIGHT,
                                            config=recipe, autocast=True)
                steps[groups].append(time.perf_counter() - started)
    finally:
        question_encoder.QUESTION_LENGTH_GROUPS = built

    rows = []
    if "embedding" in parts:
        base = sum(embedding[PASSAGE_LENGTHS[0]])
        for length in PASSAGE_LENGTHS:
            spent = embedding[length]
            rows.append((f"embedding {len(sample):,} passages, 16 a batch", f"cut at {length} tokens", ", ".join(f"{s:.1f}" for s in spent),
                         f"{len(sample) * len(spent) / sum(spent):.1f} passages/s", f"{sum(spent) / base:.2f}"))
    if "encoder" in parts:
        base = sum(steps[LENGTH_GROUPS[0]])
        for groups in LENGTH_GROUPS:
            spent = steps[groups]
            rows.append((f"question encoder, {args.steps} steps of {recipe.batch_size}",
                         "the batch whole" if groups == 1 else f"{groups} runs of similar length",
                         ", ".join(f"{s:.1f}" for s in spent), f"{sum(spent) / (args.steps * len(spent)):.2f} s/step",
                         f"{sum(spent) / base:.2f}"))
    return rows


def _reader_rows(args, paths) -> list[tuple[str, ...]]:
    from rag_demo.config import GeneratorConfig, ReaderTuningConfig
    from rag_demo.generation.generator import load_generator
    from rag_demo.offline.tuned import _reading_examples, reading_questions

    recipe = ReaderTuningConfig()
    kbs = {name: load_kb(path, name=name) for name, path in paths.kb_paths.items()}
    training, _ = reading_questions(paths.kb_paths, recipe)
    generator = load_generator(replace(GeneratorConfig(), tuned=False, dtype="float32"), path=str(paths.generator_path))
    model = generator.model
    reader.adapters_to_train(model, recipe)
    examples = _reading_examples(generator, kbs, training)
    shared = reader.shared_prefix(examples)
    bottom = reader.frozen_bottom(model, shared)
    batches = reader.length_sorted_batches([len(e.prompt_ids) + len(e.answer_ids) for e in examples],
                                          batch_size=recipe.batch_size, window=recipe.sort_window, seed=recipe.seed)
    # (name, the shared block kept below the adapters)
    settings = (("the shared block through every block", False), ("the shared block kept below the adapters", True))
    seconds = {name: [] for name, *_ in settings}
    losses_apart = 0.0
    for step in range(args.reader_steps + 1):
        batch = [examples[i] for i in batches[step % len(batches)]]
        losses = []
        for name, kept in settings:
            model.zero_grad(set_to_none=True)
            started = time.perf_counter()
            loss = reader.reading_loss(model, shared, batch, bottom=bottom if kept else None)
            loss.backward()
            if step:  # the first batch warms up
                seconds[name].append(time.perf_counter() - started)
            losses.append(loss.item())
        losses_apart = max(losses_apart, max(losses) - min(losses))
    what = f"reader, {args.reader_steps} batches of {recipe.batch_size} (losses within {losses_apart:.1e})"
    base = sum(seconds[settings[0][0]])
    return [(what, name, ", ".join(f"{s:.1f}" for s in seconds[name]), f"{sum(seconds[name]) / len(seconds[name]):.2f} s/batch",
             f"{sum(seconds[name]) / base:.2f}") for name, *_ in settings]


if __name__ == "__main__":
    raise SystemExit(main())
