"""The knowledge source: task.json of BIG-bench's contextual_parametric_knowledge_conflicts, taken
once out of the bigbench sdist on PyPI (or one put in downloads/ by hand) and read into `DefaultData`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..errors import CacheError
from ..progress import Progress
from .cache import resolve_root
from .registry import PackagedFile, ensure_packaged_file, manual_download_path
from .worlds import DefaultData, build_default_data, parse_task

log = logging.getLogger(__name__)

TASK_SOURCE = PackagedFile(
    package="bigbench", version="1.0.0", archive="bigbench-1.0.0.tar.gz",
    member="bigbench/benchmark_tasks/contextual_parametric_knowledge_conflicts/task.json",
    sha256="c8b4a4528d3530181881851f9e145d175ff41463d2742f3c73300b5c566d295a", megabytes=358,
)


def manual_sdist_path(cache: str | Path | None = None) -> Path:
    """Where to put a hand-downloaded bigbench sdist when PyPI cannot be reached (or no longer has it)."""
    return manual_download_path(TASK_SOURCE, cache)


def ensure_source(*, cache: str | Path | None = None, progress: Progress | None = None) -> Path:
    """The cached task.json, fetched from the PyPI sdist (358 MB, kept only while extracting) if needed."""
    folder = resolve_root(cache) / "sources" / f"{TASK_SOURCE.package}-{TASK_SOURCE.version}"
    return ensure_packaged_file(TASK_SOURCE, folder, cache=cache, progress=progress)


def read_default_data(task_path: str | Path) -> DefaultData:
    """Parse and restore a cached task.json."""
    task_path = Path(task_path)
    try:
        task = json.loads(task_path.read_text(encoding="utf-8"))
        records = parse_task(task)
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CacheError(f"{task_path} is unreadable or not the expected task ({err}); delete {task_path.parent} to fetch it again") from None
    data = build_default_data(records)
    stats = data.stats
    log.info(
        "%d questions kept of %d (%d without the swapped entity in the passage, %d swapped to the answer itself, "
        "%d with several mentions and nothing to check them against); %d with several mentions (%d moved to a "
        "one-mention restoration), %d with a mention inside a word; %d real and %d counterfactual passages",
        stats.kept, stats.records, stats.swapped_not_found, stats.same_answer, stats.ambiguous, stats.several_mentions,
        stats.moved, stats.inside_word, len(data.passages["nq-wiki"]), len(data.passages["nq-counterfactual"]),
    )
    return data
