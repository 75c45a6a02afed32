"""float32 against bfloat16 autocast for the build's two heavy kinds of work, side by side in one run.

    python -m benchmarks.precision [--passages 256] [--reader-batches 3] [--repeats 2]

On the cached offline default (run `python -m rag_demo prepare` first): embedding passages with the
default encoder, and steps of the reader's LoRA fine-tune on real (question, gold passage) prompts.
Each measurement alternates float32 and autocast, so both see the same machine load; the table
gives the medians, their ratio and how far the results differ (vector cosine, loss).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from rag_demo.config import EncoderConfig, GeneratorConfig
from rag_demo.precision import bf16_native, build_autocast


def _timed(fn):
    started = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - started


def embedding_rows(passages, repeats: int) -> list[tuple[str, float, float, str]]:
    from rag_demo.retrieval.encoders import load_encoder

    encoder = load_encoder(EncoderConfig())
    encoder.encode_passages(passages[:32], batch_size=32)  # first passes are slow: not measured
    exact_s, fast_s = [], []
    for _ in range(repeats):
        exact, seconds = _timed(lambda: encoder.encode_passages(passages, batch_size=32))
        exact_s.append(seconds)
        fast, seconds = _timed(lambda: encoder.encode_passages(passages, batch_size=32, autocast=True))
        fast_s.append(seconds)
    cosine = (torch.from_numpy(exact) * torch.from_numpy(fast)).sum(-1)
    return [(f"embed {len(passages)} passages", statistics.median(exact_s), statistics.median(fast_s),
             f"cosine min {cosine.min():.5f}, mean {cosine.mean():.6f}")]


def reader_rows(data, generator_path, batches: int, repeats: int) -> list[tuple[str, float, float, str]]:
    from rag_demo.generation.adapters import AdapterShape, adapter_parameters, add_adapters
    from rag_demo.generation.generator import load_generator
    from rag_demo.training.reader import ReadingExample, reading_loss, shared_prefix

    generator = load_generator(GeneratorConfig(tuned=False), path=str(generator_path))
    examples = []
    for example in data.examples[:8 * batches]:
        prompt = generator.format_input(example.question, data.passages["nq-wiki"][example.wiki_id])
        examples.append(ReadingExample(tuple(generator.tokenizer(prompt)["input_ids"]), generator.answer_target(example.answer).ids))
    shared = shared_prefix(examples)
    add_adapters(generator.model, AdapterShape(rank=16, alpha=32))
    for parameter in generator.model.parameters():
        parameter.requires_grad_(False)
    for parameter in adapter_parameters(generator.model).values():
        parameter.requires_grad_(True)
    generator.model.train()

    def step(batch, autocast: bool) -> float:
        with build_autocast("cpu", enabled=autocast):
            loss = reading_loss(generator.model, shared, batch)
        loss.backward()
        return loss.item()

    step(examples[:8], False)  # first passes are slow: not measured
    step(examples[:8], True)
    exact_s, fast_s, gaps = [], [], []
    for _ in range(repeats):
        for start in range(0, len(examples), 8):
            batch = examples[start:start + 8]
            exact, seconds = _timed(lambda: step(batch, False))
            exact_s.append(seconds)
            fast, seconds = _timed(lambda: step(batch, True))
            fast_s.append(seconds)
            gaps.append(abs(exact - fast))
    return [("reader LoRA step, 8 prompts, forward + backward", statistics.median(exact_s), statistics.median(fast_s),
             f"answer loss differs by {max(gaps):.4f} nats at most")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.precision", description=__doc__.split("\n\n")[0])
    parser.add_argument("--passages", type=int, default=256)
    parser.add_argument("--reader-batches", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    if not bf16_native("cpu"):
        raise SystemExit("this CPU has no native bfloat16: the build runs in float32 here, nothing to compare")
    from rag_demo.offline.prepare import prepare
    from rag_demo.offline.source import ensure_source, read_default_data

    paths = prepare()
    data = read_default_data(ensure_source())
    passages = sorted(data.passages["nq-wiki"], key=lambda p: -len(p.text))[::40][:args.passages]
    rows = embedding_rows(passages, args.repeats) + reader_rows(data, paths.generator_path, args.reader_batches, args.repeats)
    print("| work | float32 s | bfloat16 autocast s | speed-up | results |\n|---|---|---|---|---|")
    for name, exact, fast, note in rows:
        print(f"| {name} | {exact:.2f} | {fast:.2f} | {exact / fast:.2f}x | {note} |")


if __name__ == "__main__":
    main()
