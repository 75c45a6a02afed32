"""The Train tab's run on the real default engine, timed part by part, as a visitor would start it.

    python -m benchmarks.page_training_run                       # the page's default: RAG-Token, 100 questions
    python -m benchmarks.page_training_run --objective rag-sequence --questions 200

Times, on the page's own `TrainingRuns` and `PageRunConfig`: the first start's reading ahead of the default
run's questions (`TrainingRuns.read_ahead`, a no-op once cached: the passages it read say which), then a run
(`train_begin`: its own reading, the packaged encoder measured on the held-out sample; `train_advance` to the
end: the steps, the held-out checks and the widenings). Prints the held-out recall@5 and answer mass before and
after: the numbers the page plots. To time a first start's reading, point RAG_DEMO_CACHE at a copy of the cache
without its `training/` folder.
"""

from __future__ import annotations

import argparse
import logging
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objective", default="rag-token", choices=("rag-token", "rag-sequence", "gold-passage"))
    parser.add_argument("--questions", type=int, default=None, help="training questions (default: the page's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from rag_demo.serving.loading import engine_from_config
    from rag_demo.serving.retriever_training import PageRunConfig, TrainingRuns

    config = PageRunConfig()
    questions = args.questions or config.default_questions
    engine = engine_from_config()
    runs = TrainingRuns(lambda: engine, config=config)

    started = time.perf_counter()
    read_ahead = runs.read_ahead()
    read_ahead_s = time.perf_counter() - started
    started = time.perf_counter()
    view = runs.train_begin("benchmark", objective=args.objective, questions=questions)
    begin_s = time.perf_counter() - started
    started = time.perf_counter()
    while not view.finished:
        view = runs.train_advance("benchmark", steps=config.check_every)
    advance_s = time.perf_counter() - started

    (_, recall_before, mass_before), (_, recall_after, mass_after) = view.checks[0], view.checks[-1]
    print(f"{args.objective}, {questions} training questions, {view.steps} steps, held-out sample of {view.held_out}\n")
    print("| part | seconds |")
    print("|---|---|")
    print(f"| reading ahead at start-up ({read_ahead} passages read) | {read_ahead_s:.1f} |")
    print(f"| Train pressed: the run's reading and the packaged encoder measured | {begin_s:.1f} |")
    print(f"| {view.steps} steps, {len(view.checks) - 1} held-out checks, widenings | {advance_s:.1f} |")
    print(f"| a step (mean) | {view.step_seconds:.2f} |")
    print(f"\nheld-out recall@5 {100 * recall_before:.1f} -> {100 * recall_after:.1f}; "
          f"answer mass {100 * mass_before:.1f} -> {100 * mass_after:.1f}")


if __name__ == "__main__":
    main()
