"""Two settings of a first start's build, each against the one it replaced, side by side in one run.

    python -m benchmarks.build_steps --rounds 2 --every 16 --steps 15

Embedding: every `--every`th passage of the default KBs in the build's longest-first order (so the
sample has the build's mix of lengths), embedded at 32, 16 and 8 passages a batch in turn, each
round in the same order. The question encoder's fine-tune: `--steps` steps of the build's recipe
with torch's plain AdamW (one op at a time) and with the fused one the build uses, in turn. A slow spell
of the machine thus lands on every setting. Prints one table of seconds and rates.
"""

from __future__ import annotations

import argparse
import time

import torch

from rag_demo.config import DEFAULT_LEXICAL_WEIGHT, EngineConfig, TuningConfig
from rag_demo.corpus import load_kb
from rag_demo.encoders import load_encoder
from rag_demo.lexical import LexicalIndex
from rag_demo.offline.prepare import prepare
from rag_demo.offline.source import ensure_source, read_default_data
from rag_demo.offline.tuned import training_split
from rag_demo.questions import load_questions
from rag_demo import tuning as tuner

BATCH_SIZES = (32, 16, 8)


def _adamw(fused: bool):
    plain = torch.optim.AdamW

    def make(params, **options):
        options["fused"] = fused
        return plain(params, **options)

    return make


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.build_steps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each comparison")
    parser.add_argument("--every", type=int, default=16, help="embed every n-th passage of the build's order")
    parser.add_argument("--steps", type=int, default=15, help="question-encoder steps per setting and round")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.every < 1 or args.steps < 1:
        raise SystemExit("--rounds, --every and --steps must be at least 1")
    paths = prepare()
    config = EngineConfig().encoder
    encoder = load_encoder(config)
    data = read_default_data(ensure_source())
    unique = sorted({p for name in data.passages for p in data.passages[name]},
                    key=lambda p: (-len(p.title) - len(p.text), p.title, p.text))  # as `offline.kbs` orders them
    sample = unique[::args.every]
    encoder.encode_passages(sample[:64], batch_size=16)  # warms up
    embedding = {size: [] for size in BATCH_SIZES}
    for _ in range(args.rounds):
        for size in BATCH_SIZES:
            started = time.perf_counter()
            encoder.encode_passages(sample, batch_size=size, autocast=True)
            embedding[size].append(time.perf_counter() - started)

    wiki = paths.kb_paths["nq-wiki"]
    kb = load_kb(wiki)
    lexical = LexicalIndex.for_passages(kb.titles, kb.texts)
    training, _ = training_split(load_questions(wiki))
    recipe = TuningConfig()
    questions = [tuner.TrainingQuestion(q.question, q.gold_id) for q in training][:recipe.batch_size * args.steps]
    steps = {False: [], True: []}
    plain = torch.optim.AdamW
    try:
        for _ in range(args.rounds):
            for fused in (False, True):
                torch.optim.AdamW = _adamw(fused)
                started = time.perf_counter()
                tuner.tune_question_encoder(encoder, kb.embeddings, lexical, questions, lexical_weight=DEFAULT_LEXICAL_WEIGHT,
                                            config=recipe, autocast=True)
                steps[fused].append(time.perf_counter() - started)
    finally:
        torch.optim.AdamW = plain

    print(f"\nbuild steps, {args.rounds} rounds, threads {torch.get_num_threads()}\n")
    print("| what | setting | seconds per round | rate | ratio to the first row |")
    print("|---|---|---|---|---|")
    base = sum(embedding[BATCH_SIZES[0]])
    for size in BATCH_SIZES:
        spent = embedding[size]
        print(f"| embedding {len(sample):,} passages | {size} a batch | {', '.join(f'{s:.1f}' for s in spent)} | "
              f"{len(sample) * len(spent) / sum(spent):.1f} passages/s | {sum(spent) / base:.2f} |")
    base = sum(steps[False])
    for fused in (False, True):
        spent = steps[fused]
        print(f"| question encoder, {args.steps} steps of {recipe.batch_size} | {'fused' if fused else 'plain'} AdamW | "
              f"{', '.join(f'{s:.1f}' for s in spent)} | {sum(spent) / (args.steps * len(spent)):.2f} s/step | {sum(spent) / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
