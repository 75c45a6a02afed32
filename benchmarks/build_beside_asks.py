"""Asks while a first start's build runs: with the build stepping aside for them, and without.

    python -m benchmarks.build_beside_asks                # the cache at RAG_DEMO_CACHE or ~/.cache/rag-demo
    python -m benchmarks.build_beside_asks --runs 2 --passages 1000 --head-start 20

Loads the default engine from a full cache, then stands in for a first start's build: a
`BackgroundEngine` whose build thread embeds nq-wiki passages with the default encoder and reports
progress after each batch, as `prepare` does. `--head-start` seconds after the build starts, it asks
two questions in a row through the `BackgroundEngine` and times them. The two settings alternate:
the build steps aside while an ask runs (`background.Answering`, the default) or shares the cores
(its `step_aside` a no-op, as before). Also times the two asks with no build at all. Prints one
table of seconds.
"""

from __future__ import annotations

import argparse
import time

QUESTIONS = ("who sang i will always love you first", "when did the titanic sink")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.build_beside_asks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of each setting, alternated")
    parser.add_argument("--passages", type=int, default=1000, help="passages the stand-in build embeds")
    parser.add_argument("--head-start", type=float, default=20.0, help="seconds the build runs before the first ask")
    args = parser.parse_args(argv)

    from rag_demo.serving.background import BackgroundEngine, Stage, default_engines

    engine = next(default_engines(lambda *a, **k: None)).engine
    kb = engine.kbs["nq-wiki"]
    step = max(1, len(kb) // args.passages)
    passages = [kb.passage(row) for row in range(0, len(kb), step)][: args.passages]
    engine.ask(QUESTIONS[0], kb="nq-wiki", k=5)  # warm: the first ask of a process is slower

    def timed_asks(target) -> list[float]:
        seconds = []
        for question in QUESTIONS:
            started = time.perf_counter()
            target.ask(question, kb="nq-wiki", k=5)
            seconds.append(time.perf_counter() - started)
        return seconds

    rows = [("alone, no build", timed_asks(engine), None)]
    for _ in range(args.runs):
        for setting in ("steps aside", "shares the cores"):
            built: dict[str, float] = {}

            def factory(progress):
                yield Stage(engine, serving="the engine", building="embedding")
                started = time.perf_counter()
                engine.encoder.encode_passages(passages, batch_size=32,
                                               progress=lambda done, total: progress("embedding", done, total))
                built["seconds"] = time.perf_counter() - started
                yield Stage(engine, serving="the engine")

            background = BackgroundEngine(factory)
            if setting == "shares the cores":
                background.answering.step_aside = lambda: 0.0
            background.start()
            while not background.ready:
                time.sleep(0.05)
            time.sleep(args.head_start)
            asks = timed_asks(background)
            background.wait()
            rows.append((setting, asks, built["seconds"]))
    print(f"| the build | ask 1 (s) | ask 2 (s) | embedding {args.passages:,} passages (s) |\n|---|---:|---:|---:|")
    for setting, asks, seconds in rows:
        print(f"| {setting} | {asks[0]:.1f} | {asks[1]:.1f} | {'-' if seconds is None else f'{seconds:.1f}'} |")


if __name__ == "__main__":
    main()
