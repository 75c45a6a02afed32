"""What one step of the reader's training costs, by the share of the generator's blocks that carry adapters.

    python -m benchmarks.reader_steps --shares 1,0.67,0.5 --steps 6

Builds the offline default if needed, loads one copy of the converted generator per share, gives
each fresh adapters on the top `share` of its blocks, and times forward, backward and one AdamW
step on the same length-sorted training batches the build uses, the copies taking turns batch by
batch so that a slow spell of the machine lands on all of them. The first step of each copy warms
up and is left out. Prints one markdown table with each share's ratio to the first.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from rag_demo.generation.adapters import first_block_for_share
from rag_demo.config import GeneratorConfig, ReaderTuningConfig
from rag_demo.retrieval.corpus import load_kb
from rag_demo.generation.generator import load_generator
from rag_demo.offline.prepare import prepare
from rag_demo.offline.tuned import _reading_examples, reading_questions
from rag_demo.training.reader import adapters_to_train, length_sorted_batches, reading_loss, shared_prefix


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", default="1,0.5", help="comma-separated shares of the blocks, from the top, that get adapters")
    parser.add_argument("--steps", type=int, default=6, help="steps per share, the first left out")
    args = parser.parse_args(argv)
    shares = [float(share) for share in args.shares.split(",")]
    if args.steps < 2:
        raise SystemExit("--steps must be at least 2: the first step only warms up")
    recipe = ReaderTuningConfig()
    paths = prepare()
    kbs = {name: load_kb(path, name=name) for name, path in paths.kb_paths.items()}
    training, _ = reading_questions(paths.kb_paths, recipe)
    copies = []
    for share in shares:
        generator = load_generator(replace(GeneratorConfig(), tuned=False), path=str(paths.generator_path))
        first = first_block_for_share(generator.model, share)
        trained = adapters_to_train(generator.model, replace(recipe, adapted_share=share))
        copies.append((share, first, generator, torch.optim.AdamW(trained, lr=recipe.learning_rate)))
    examples = _reading_examples(copies[0][2], kbs, training)
    shared = shared_prefix(examples)
    batches = length_sorted_batches([len(e.prompt_ids) + len(e.answer_ids) for e in examples], batch_size=recipe.batch_size,
                                    window=recipe.sort_window, seed=recipe.seed)
    seconds = {share: [] for share in shares}
    for step in range(args.steps):
        batch = [examples[i] for i in batches[step % len(batches)]]
        for share, _, generator, optimizer in copies:
            started = time.perf_counter()
            loss = reading_loss(generator.model, shared, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seconds[share].append(time.perf_counter() - started)
    baseline = sum(seconds[shares[0]][1:])
    print(f"\nreader training steps of {recipe.batch_size} questions, steps 2-{args.steps}, threads {torch.get_num_threads()}\n")
    print("| share of blocks adapted | first adapted block | s per step | ratio |")
    print("|---|---|---|---|")
    for share, first, _, _ in copies:
        spent = sum(seconds[share][1:])
        print(f"| {share:g} | {first} | {spent / (args.steps - 1):.2f} | {spent / baseline:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
