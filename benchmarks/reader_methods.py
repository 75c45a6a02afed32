"""Which reader reads better: the default's LoRA adapter or a full fine-tune, on the same held-out questions.

    python -m benchmarks.reader_methods --n 300 --seed 0            # the gold passage alone (the reading ceiling)
    python -m benchmarks.reader_methods --n 100 --seed 0 --k 5      # retrieved passages, both variants
    python -m benchmarks.reader_methods --n 100 --readers lora:examples=1200   # the adapter against another recipe
    python -m benchmarks.reader_methods --k 5 --n 150 --seed 7 --readers lora:distractors=600   # reading beside distractors
    python -m benchmarks.reader_methods --k 5 --n 150 --seed 7 --readers lora:marginal_passages=3+examples=600   # the paper's loss

Builds the offline default if needed, then asks the same sampled held-out questions of the cached
adapter and of each of `--readers`: `base` (the converted generator), `full` (a full fine-tune
trained here with the same questions and prompt: every weight but the embeddings, AdamW 2e-5;
about 15 minutes on 2 CPU cores) and `lora:FIELD=VALUE+...` (another adapter recipe, trained here:
the default `ReaderTuningConfig` with those fields changed). Nothing trained here is cached. Prints
one markdown table.
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import replace

from rag_demo.config import GeneratorConfig, ReaderTuningConfig
from rag_demo.evaluate import evaluate_table
from rag_demo.generation.generator import load_generator
from rag_demo.serving.loading import engine_from_config
from rag_demo.offline.prepare import prepare
from rag_demo.offline.tuned import train_reader

FULL_RECIPE = ReaderTuningConfig(method="full", learning_rate=2e-5)


def _cell(report: dict, key: str) -> str:
    value, bounds = report[key], (report.get("intervals") or {}).get(key)
    if value is None:
        return "n/a"
    return f"{100 * value:.1f} ({100 * bounds[0]:.1f}-{100 * bounds[1]:.1f})" if bounds else f"{100 * value:.1f}"


def _row(label: str, r: dict) -> str:
    return f"| {label} | {r['kb']} | {r['variant']} | {r['n']} | {_cell(r, 'exact_match')} | {_cell(r, 'original_match')} |"


def _recipe(fields: str) -> ReaderTuningConfig:
    """The default adapter recipe with FIELD=VALUE pairs (joined by '+') changed, each value read as its field's type."""
    base = ReaderTuningConfig()
    changes = {}
    for pair in filter(None, fields.split("+")):
        key, _, value = pair.partition("=")
        if not hasattr(base, key) or not value:
            raise SystemExit(f"{pair!r}: not FIELD=VALUE of ReaderTuningConfig")
        changes[key] = type(getattr(base, key))(value)
    return replace(base, **changes)


def _retrieved(retrieval) -> tuple[list[int], list[float]]:
    """(rows, log p(z|x)) of an engine retrieval, for marginal training (`lora:marginal_passages=K`)."""
    return [passage.id for passage in retrieval.passages], retrieval.doc_lp.tolist()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="held-out questions per KB")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", type=int, default=None, help="retrieve k passages instead of reading the gold one")
    parser.add_argument("--readers", default="base,full",
                        help="besides the cached adapter, comma-separated: base, full, lora:FIELD=VALUE+... "
                             "(e.g. lora:examples=1200 or lora:epochs=2+rank=32)")
    parser.add_argument("--kbs", default="", help="comma-separated knowledge bases to ask (default: both)")
    parser.add_argument("--skip-cached", action="store_true",
                        help="do not ask the cached adapter (already measured on these questions, e.g. by eval --table)")
    parser.add_argument("--float32", action="store_true",
                        help="train here in float32 even where bfloat16 autocast is native (the cached build uses autocast)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    prepared = prepare()
    engine = engine_from_config()
    gold = args.k is None
    variants = ("token",) if gold else ("token", "sequence")

    def measure(label: str) -> list[tuple[str, dict]]:
        started = time.perf_counter()
        kbs = tuple(filter(None, args.kbs.split(","))) or engine.kb_names
        reports = evaluate_table(engine, kbs=kbs, ks=(args.k or 1,), n=args.n, seed=args.seed, variants=variants,
                                 gold_passage=gold)
        logging.info("%s: %.0f s", label, time.perf_counter() - started)
        for r in reports:  # logged as soon as measured: a run stopped later keeps what it measured
            logging.info("%s", _row(label, r))
        return [(label, r) for r in reports]

    rows = [] if args.skip_cached else measure(f"LoRA adapter ({prepared.reader_adapter_path.name})")
    adapter_generator = engine.generator
    for reader in filter(None, args.readers.split(",")):
        name, _, fields = reader.strip().partition(":")
        if name not in ("base", "full", "lora"):
            parser.error(f"unknown reader {reader!r}: use base, full or lora:FIELD=VALUE+...")
        engine.generator = load_generator(replace(GeneratorConfig(), tuned=False), path=str(prepared.generator_path))
        if name == "base":
            rows += measure("converted generator, no fine-tuning")
            continue
        recipe = FULL_RECIPE if name == "full" else _recipe(fields)
        started = time.perf_counter()
        info = train_reader(engine.generator, prepared.kb_paths, tuning=recipe, autocast=not args.float32, check_before=True,
                            retrieve=lambda kb, question, k, rows: _retrieved(engine.retrieve(question, kb=kb, k=k, rows=rows)))
        logging.info("%s: trained in %.0f s, answer loss %.3f -> %.3f", reader, time.perf_counter() - started,
                     info["answer_loss_before"], info["answer_loss_after"])
        rows += measure(f"full fine-tune (every weight but the embeddings), {info['precision']}" if name == "full"
                        else f"LoRA adapter trained here, {fields or 'the default recipe'}, {info['precision']}")
    engine.generator = adapter_generator
    print(f"\n{'gold passage alone' if gold else f'k={args.k} retrieved'}, n={args.n} per KB, seed={args.seed}\n")
    print("| reader | KB | variant | n | EM (95% CI) | real-world answer (95% CI) |")
    print("|---|---|---|---|---|---|")
    for label, r in rows:
        print(_row(label, r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
