"""Run the demo: config -> engine -> page -> launch.

    python app.py        # http://127.0.0.1:7860; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override
    python app.py --kb-path big=/data/big-kb     # a KB folder of your own beside the default ones

Own KB folders (`python -m rag_demo build-kb ... --vectors float16` for one larger than memory,
or transformers' format) can also be named in RAG_DEMO_KB_PATHS="big=/data/big-kb,other=/x", as
a Space sets them; they appear in the page's list after the default ones.

The engine is built in a background thread, so on a first start (models to fetch, indexes to
build) the page comes up at once and shows progress until it is ready. Pass another factory
to `main` / `create_demo` to serve a different engine.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence

from rag_demo import heap
from rag_demo.background import BackgroundEngine, Engine, Stage
from rag_demo.progress import Progress

log = logging.getLogger("rag_demo.app")


def default_engines(progress: Progress, *, extra_kbs: dict | None = None) -> Iterator[Stage]:
    """The real engine with the default config, in stages on a first start (heavy imports happen
    here, not at import time): BM25 and the base generator answer within minutes, and each part
    built afterwards is swapped in (`rag_demo.offline.prepare` says which). A warm start yields the
    complete engine at once. `extra_kbs` (name -> loaded KB) follow the default KBs."""
    from rag_demo.config import EngineConfig
    from rag_demo.featured import feature_checked_examples
    from rag_demo.loading import staged_default_engines

    for engine, readiness in staged_default_engines(EngineConfig(), progress=progress, extra_kbs=extra_kbs):
        engine.retriever.warm_up()  # BM25 and the indexes before the first ask, not during it
        if not readiness.complete:
            yield Stage(engine, readiness.serving(), readiness.building())
            continue
        # Full quality serves at once; what follows only orders the example questions (asked once per
        # setup, saved) and warms the caches, and a visitor's ask meanwhile just shares the cores.
        yield Stage(engine, readiness.serving())
        feature_checked_examples(engine, progress=progress)
        progress("warming up: one example question", 0, 1)
        seconds = engine.warm_up()
        progress("warming up: one example question", 1, 1)
        log.info("warm-up ask took %.1f s", seconds)
        heap.release_free_memory()  # loading parsed large files (the tokenizer's JSON) into memory now free


def server_options(environ: Mapping[str, str]) -> dict:
    """Host and port from GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (defaults: 127.0.0.1, first free from 7860).

    >>> server_options({"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "7861"})
    {'server_name': '0.0.0.0', 'server_port': 7861}
    """
    port = environ.get("GRADIO_SERVER_PORT")
    return {"server_name": environ.get("GRADIO_SERVER_NAME") or "127.0.0.1", "server_port": int(port) if port else None}


def create_demo(factory: Callable[[Progress], Engine | Iterator[Stage]] = default_engines):
    """Start building the engine in the background and return the page that waits for it.

    The engine's thread starts before gradio is imported: on a warm start the models load while
    the page is built, instead of after it."""
    engine = BackgroundEngine(factory).start()
    from rag_demo.ui import build_demo

    return build_demo(engine)


def kb_paths_from(items: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """NAME=PATH pairs from `--kb-path` items and RAG_DEMO_KB_PATHS (comma-separated), in that order.

    >>> kb_paths_from(["big=/data/big"], {"RAG_DEMO_KB_PATHS": "a=/x, b=/y"})
    {'big': '/data/big', 'a': '/x', 'b': '/y'}
    """
    from rag_demo.config import named_paths

    listed = [*items, *filter(None, (part.strip() for part in environ.get("RAG_DEMO_KB_PATHS", "").split(",")))]
    return named_paths(listed, what="--kb-path or RAG_DEMO_KB_PATHS")


def load_extra_kbs(paths: dict[str, str]) -> dict:
    """The named KB folders, loaded (memory-mapped where large) before the page starts, so that a
    wrong path stops the start with its reason instead of leaving the page without that KB."""
    if not paths:
        return {}
    from rag_demo.loading import load_kbs

    return load_kbs(paths)


def main(factory: Callable[[Progress], Engine | Iterator[Stage]] | None = None, argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python app.py", description="Serve the RAG demo page.")
    parser.add_argument("--kb-path", action="append", default=[], metavar="NAME=PATH",
                        help="a KB folder of your own, listed after the default KBs (repeatable; or RAG_DEMO_KB_PATHS)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if factory is None:
        from rag_demo.errors import RagDemoError

        try:
            extra = load_extra_kbs(kb_paths_from(args.kb_path, os.environ))
        except (ValueError, RagDemoError) as err:
            sys.exit(f"python app.py: {err}")
        factory = functools.partial(default_engines, extra_kbs=extra) if extra else default_engines
    # before the server starts its worker threads, so that they share two malloc arenas (rag_demo.heap)
    heap.limit_arenas(2)
    demo = create_demo(factory)
    from rag_demo.ui import launch_options

    options = server_options(os.environ)
    log.info("serving on %s:%s", options["server_name"], options["server_port"] or "7860+")
    demo.launch(**options, max_file_size="10mb", **launch_options())


if __name__ == "__main__":
    main()
