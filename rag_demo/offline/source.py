"""The knowledge source: task.json of BIG-bench's contextual_parametric_knowledge_conflicts, taken
once out of the bigbench sdist on PyPI (or one put in downloads/ by hand) and read into `DefaultData`."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from ..errors import CacheError
from ..progress import Progress
from .cache import is_complete, publish, report, require_space, resolve_root, staged, timed, writing
from .worlds import DefaultData, build_default_data, parse_task

log = logging.getLogger(__name__)

SOURCE_PACKAGE = "bigbench"
SOURCE_VERSION = "1.0.0"
SOURCE_MEMBER = "bigbench/benchmark_tasks/contextual_parametric_knowledge_conflicts/task.json"
SOURCE_SHA256 = "c8b4a4528d3530181881851f9e145d175ff41463d2742f3c73300b5c566d295a"  # that task.json in 1.0.0
SOURCE_FILE = "task.json"


def _source_folder(root: Path) -> Path:
    return root / "sources" / f"{SOURCE_PACKAGE}-{SOURCE_VERSION}"


def manual_sdist_path(cache: str | Path | None = None) -> Path:
    """Where to put a hand-downloaded sdist when PyPI cannot be reached."""
    root = resolve_root(cache)
    return root / "downloads" / f"{SOURCE_PACKAGE}-{SOURCE_VERSION}.tar.gz"


def _pip_download_command(requirement: str, dest: Path) -> list[str]:
    # The sdist, not a wheel: only the sdist carries the benchmark task files.
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check", "--no-cache-dir",
        "--timeout", "30", "--retries", "2", "--dest", str(dest), requirement,
    ]


def _download_sdist(dest: Path, manual: Path) -> Path:
    requirement = f"{SOURCE_PACKAGE}=={SOURCE_VERSION}"
    command = _pip_download_command(requirement, dest)
    log.info("downloading the %s sdist: %s", requirement, " ".join(command))
    advice = (
        f"connect to PyPI and try again, or download {SOURCE_PACKAGE}-{SOURCE_VERSION}.tar.gz "
        f"(https://pypi.org/project/{SOURCE_PACKAGE}/{SOURCE_VERSION}/#files) and put it at {manual}"
    )
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CacheError(f"could not run pip to download {requirement} ({type(err).__name__}); {advice}") from None
    log.debug("pip output:\n%s\n%s", result.stdout, result.stderr)
    sdists = sorted(dest.glob(f"{SOURCE_PACKAGE}-{SOURCE_VERSION}.tar.gz"))
    if result.returncode != 0 or not sdists:
        lines = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        said = lines[-1][:200] if lines else f"exit code {result.returncode}"
        raise CacheError(f"could not download {requirement} from PyPI (pip: {said}); {advice}")
    return sdists[0]


def extract_member(sdist: Path, member: str, out: Path) -> str:
    """Stream one file out of a .tar.gz without unpacking the rest; returns its sha256.

    The member is matched below the sdist's top folder ("bigbench-1.0.0/<member>").
    """
    digest = hashlib.sha256()
    try:
        with tarfile.open(sdist, "r|gz") as archive:
            for entry in archive:
                if entry.isfile() and entry.name.split("/", 1)[-1] == member:
                    handle = archive.extractfile(entry)
                    with writing(out.parent), out.open("wb") as sink:
                        while block := handle.read(1 << 20):
                            digest.update(block)
                            sink.write(block)
                    return digest.hexdigest()
    except (tarfile.TarError, EOFError, OSError) as err:
        raise CacheError(f"{sdist} is not a readable .tar.gz ({err}); delete it and run `python -m rag_demo prepare` again") from None
    raise CacheError(f"{sdist} holds no {member}; it is not the {SOURCE_PACKAGE} {SOURCE_VERSION} sdist, delete it")


def ensure_source(*, cache: str | Path | None = None, progress: Progress | None = None) -> Path:
    """The cached task.json, fetched from the PyPI sdist (358 MB, kept only while extracting) if needed."""
    root = resolve_root(cache)
    folder = _source_folder(root)
    key = f"{SOURCE_PACKAGE}=={SOURCE_VERSION}:{SOURCE_MEMBER}:{SOURCE_SHA256}"
    if is_complete(folder, key):
        return folder / SOURCE_FILE
    manual = manual_sdist_path(root)
    with staged(folder) as staging:
        if manual.is_file():
            log.info("using the hand-placed sdist %s", manual)
            sdist = manual
        else:
            require_space(staging, 500_000_000, f"downloading {SOURCE_PACKAGE} {SOURCE_VERSION}")
            stage = f"downloading {SOURCE_PACKAGE} {SOURCE_VERSION} from PyPI (358 MB)"
            report(progress, stage, 0, 1)
            with writing(staging):
                (staging / "download").mkdir()
            with timed("downloading the sdist"):
                sdist = _download_sdist(staging / "download", manual)
            report(progress, stage, 1, 1)
        report(progress, "extracting task.json", 0, 1)
        with timed("extracting task.json"):
            sha256 = extract_member(sdist, SOURCE_MEMBER, staging / SOURCE_FILE)
        report(progress, "extracting task.json", 1, 1)
        if sha256 != SOURCE_SHA256:
            raise CacheError(
                f"task.json in {sdist.name} has sha256 {sha256[:12]}..., not the pinned {SOURCE_SHA256[:12]}...; "
                f"the sdist is not {SOURCE_PACKAGE} {SOURCE_VERSION} as published (delete {manual} if you placed it there)"
            )
        with writing(staging):
            shutil.rmtree(staging / "download", ignore_errors=True)
        publish(staging, folder, key, {"sha256": sha256})
    return folder / SOURCE_FILE


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
