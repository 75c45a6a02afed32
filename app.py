"""Run the demo: config -> engine -> page -> launch.

    python app.py        # http://127.0.0.1:7860; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override
    python app.py --kb-path big=/data/big-kb     # a KB folder of your own beside the default ones

Own KB folders (`python -m rag_demo build-kb ... --vectors float16` for one larger than memory,
or transformers' format) can also be named in RAG_DEMO_KB_PATHS="big=/data/big-kb,other=/x", as
a Space sets them; they appear in the page's list after the default ones.

The engine is built in a process of its own (`rag_demo.serving.process`; RAG_DEMO_ENGINE_PROCESS=0
keeps it in this one, in a thread) while this one imports gradio and serves the page: on a first
start (models to fetch, indexes to build) the page comes up at once and shows progress until it is
ready, and on a warm start the two halves load side by side on two cores. Pass another factory to
`main` / `create_demo` to serve a different engine.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence

from rag_demo.serving import heap
from rag_demo.serving.background import BackgroundEngine, Stage, default_engines
from rag_demo.serving.interface import Engine
from rag_demo.progress import Progress

log = logging.getLogger("rag_demo.app")


def server_options(environ: Mapping[str, str]) -> dict:
    """Host and port from GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (defaults: 127.0.0.1, first free from 7860).

    >>> server_options({"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "7861"})
    {'server_name': '0.0.0.0', 'server_port': 7861}
    """
    port = environ.get("GRADIO_SERVER_PORT")
    return {"server_name": environ.get("GRADIO_SERVER_NAME") or "127.0.0.1", "server_port": int(port) if port else None}


def create_demo(factory: Callable[[Progress], Engine | Iterator[Stage]] = default_engines, *,
                separate_process: bool = False):
    """Start building the engine and return the page that waits for it.

    The build starts before gradio is imported, so that on a warm start the models load while the
    page is built: in a child process with `separate_process` (the factory must then pickle: a
    module-level function or a partial of one), else in a thread of this one. The answers that
    cross from the child are plain data, so this process never imports torch."""
    if separate_process:
        from rag_demo.serving.process import EngineProcess

        engine = EngineProcess(factory).start()
    else:
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


def checked_kb_paths(paths: dict[str, str]) -> dict[str, str]:
    """The named KB folders, once each is a saved dataset: a wrong path stops the start with its
    reason before anything is served. (They load with the engine, which checks their columns.)"""
    from rag_demo.retrieval.corpus import saved_kb_folder

    for path in paths.values():
        saved_kb_folder(path)
    return paths


def main(factory: Callable[[Progress], Engine | Iterator[Stage]] | None = None, argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python app.py", description="Serve the RAG demo page.")
    parser.add_argument("--kb-path", action="append", default=[], metavar="NAME=PATH",
                        help="a KB folder of your own, listed after the default KBs (repeatable; or RAG_DEMO_KB_PATHS)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    separate_process = False  # a factory given here may not pickle: it runs in a thread of this process
    if factory is None:
        from rag_demo.serving.process import engine_process_wanted
        from rag_demo.errors import RagDemoError

        separate_process = engine_process_wanted(os.environ)
        try:
            extra = checked_kb_paths(kb_paths_from(args.kb_path, os.environ))
        except (ValueError, RagDemoError) as err:
            sys.exit(f"python app.py: {err}")
        factory = functools.partial(default_engines, extra_kb_paths=extra) if extra else default_engines
    # before the server starts its worker threads, so that they share two malloc arenas (rag_demo.serving.heap)
    heap.limit_arenas(2)
    log.info("building the engine in %s", "a process of its own" if separate_process else "a thread")
    demo = create_demo(factory, separate_process=separate_process)
    from rag_demo.ui import launch_options

    options = server_options(os.environ)
    log.info("serving on %s:%s", options["server_name"], options["server_port"] or "7860+")
    demo.launch(**options, max_file_size="10mb", **launch_options())


if __name__ == "__main__":
    main()
