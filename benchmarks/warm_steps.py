"""A warm start step by step, in this one fresh process, on a cache that holds the whole offline default.

    python -m benchmarks.warm_steps                 # the cache at RAG_DEMO_CACHE or ~/.cache/rag-demo
    python -m benchmarks.warm_steps --warm-up       # with the engine's warm-up ask before the first

Times each thing `python app.py` does before it can answer, one after another: the imports, the
knowledge bases, the encoder, the generator (its tokenizer apart), two asks (the page's default:
k = 5, both variants and closed-book) and, last, importing gradio. In the app the engine loads in a
process of its own while the page's process imports gradio and builds the page, each on a core,
so the steps before gradio's are about what the engine's process spends before its first
answer. Prints one table of seconds.
"""

from __future__ import annotations

import argparse
import time

QUESTIONS = ("who wrote the declaration of independence", "who sang i will always love you first")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warm_steps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm-up", action="store_true", help="run the engine's warm-up ask before the first ask")
    args = parser.parse_args(argv)
    steps: list[tuple[str, float]] = []
    last = time.perf_counter()

    def step(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        steps.append((name, now - last))
        last = now

    import torch

    step("import torch")
    import faiss  # noqa: F401
    import pyarrow  # noqa: F401  (what loading a KB folder imports; `datasets` only for other folder forms)

    step("import pyarrow, faiss")
    from rag_demo.config import EngineConfig, cache_root
    from rag_demo.engine import RagEngine
    from rag_demo.retrieval.encoders import load_encoder
    from rag_demo.generation.generator import load_generator
    from rag_demo.serving.loading import load_kbs
    from rag_demo.offline.prepare import prepare_in_stages
    from rag_demo.generation.tokenizing import load_tokenizer

    step("import rag_demo")
    for readiness in prepare_in_stages():
        pass
    if not readiness.complete:
        raise SystemExit("the cache does not hold the whole offline default; run `python -m rag_demo prepare` first")
    paths, config, cpu = readiness.paths, EngineConfig(), torch.device("cpu")
    step("check the cache's markers")
    kbs = load_kbs({name: str(path) for name, path in paths.kb_paths.items()})
    step("load both knowledge bases")
    encoder = load_encoder(config.encoder, device=cpu, question_path=paths.question_encoder_path)
    step("load the encoder (the first model: transformers' modeling imports)")
    load_tokenizer(str(paths.generator_path), converted=True)
    step("the generator's tokenizer alone (loaded again below; not in the sum)")
    generator = load_generator(config.generator, path=str(paths.generator_path), device=cpu,
                               adapter=paths.reader_adapter_path, states=cache_root() / "states")
    step("load the generator, its tokenizer and the reading adapter")
    engine = RagEngine(encoder=encoder, generator=generator, kbs=kbs, config=config, index_cache=cache_root() / "indexes")
    engine.retriever.warm_up()
    step("the retriever's indexes")
    if args.warm_up:
        engine.warm_up()
        step("the engine's warm-up ask")
    for number, question in enumerate(QUESTIONS, start=1):
        engine.ask(question, k=5)
        step(f"ask {number} (k = 5, both variants, closed-book)")
    import gradio  # noqa: F401

    step("import gradio")
    total = sum(seconds for name, seconds in steps if "not in the sum" not in name)
    print("| step | seconds |\n|---|---:|")
    for name, seconds in steps:
        print(f"| {name} | {seconds:.2f} |")
    print(f"| all | {total:.2f} |")


if __name__ == "__main__":
    main()
