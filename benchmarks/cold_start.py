"""One first start end to end, as a Space meets it after a sleep: `python app.py` on an empty cache.

    python -m benchmarks.cold_start --cache /tmp/cold-cache            # the folder must be empty or absent
    python -m benchmarks.cold_start --cache /tmp/cold-cache --json cold.json
    python -m benchmarks.cold_start --cache ~/.cache/rag-demo --warm   # a warm start alone

Starts the app with RAG_DEMO_CACHE pointing at the folder and reads its `/status_json` every
couple of seconds. Each time another part of the offline default starts serving (BM25 and the
base generator first, then dense vectors, the fine-tuned question side, the reading adapter), it
asks one question through `/ask_json`, as a visitor would, and records how long the answer took
and which parts answered (the answer's notices). Once everything is built it stops the app, starts
it again on the now full cache and times the warm start to the first answer. The app's peak
resident memory (VmHWM) is read from /proc, summed over the app and its engine's process (each
one's own peak: an upper bound of their peak together). Prints one table; wall-clock seconds are measured from
the moment `python app.py` is started.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.load import _free_port, launch_app
from rag_demo.serving.heap import tree_mb

log = logging.getLogger(__name__)

QUESTION = "who wrote the declaration of independence"
POLL_S = 2.0


@dataclass
class Event:
    at_s: float  # since `python app.py` started
    what: str
    detail: str = ""


@dataclass
class ColdStart:
    events: list[Event] = field(default_factory=list)
    first_answer_s: float | None = None
    full_quality_s: float | None = None
    warm_ready_s: float | None = None  # when `/status_json` first said ready (polled every 0.2 s or so)
    warm_first_answer_s: float | None = None
    peak_rss_mb: float | None = None
    warm_peak_rss_mb: float | None = None


def _client(url: str):
    from gradio_client import Client

    return Client(url, verbose=False, analytics_enabled=False, download_files=False)


def _launch(cache: Path, log_path: Path):
    """(`python app.py` on `cache`, started now on a free port; its address; seconds since it started, as a function)."""
    os.environ["RAG_DEMO_CACHE"] = str(cache)
    port = _free_port()
    started = time.monotonic()
    process = launch_app(port, log_path)
    return process, f"http://127.0.0.1:{port}/", lambda: time.monotonic() - started


def _connect(url: str, process: subprocess.Popen, timeout_s: float):
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if process.poll() is not None:
            raise SystemExit(f"the app exited with code {process.returncode}")
        try:
            return _client(url)
        except Exception:  # not listening yet
            time.sleep(0.5)
    raise SystemExit(f"the app at {url} did not come up within {timeout_s:.0f} s")


def _ask(client, question: str) -> tuple[float, dict | None, str]:
    """(seconds, the AskResult as JSON or None, error text)."""
    started = time.monotonic()
    try:
        result = client.predict(question, "both", 5, "flat", "", "", False, api_name="/ask_json")
        return time.monotonic() - started, result, ""
    except Exception as err:  # not ready yet, or a real failure: the caller records it
        return time.monotonic() - started, None, f"{type(err).__name__}: {str(err)[:160]}"


def _status(client) -> dict:
    """The app's `/status_json`, or {} while it cannot say."""
    try:
        return client.predict(api_name="/status_json")
    except Exception as err:  # the page is up but its handler failed: treated as not ready
        log.debug("status: %s", err)
        return {}


def _answer_summary(result: dict) -> str:
    variants = result.get("variants") or {}
    answers = [f"{name}: {v.get('answer', '')!r}" for name, v in variants.items()] if isinstance(variants, dict) else []
    notices = "; ".join(result.get("notices") or [])
    return f"{', '.join(answers)} | retriever {result.get('retriever')} | {notices}"


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def measure_cold(cache: Path, *, question: str, timeout_s: float, log_dir: Path) -> ColdStart:
    report = ColdStart()
    process, url, now = _launch(cache, log_dir / "cold-start-app.log")
    try:
        client = _connect(url, process, 300)
        report.events.append(Event(now(), "page up"))
        seen_stage = None
        while now() < timeout_s:
            if process.poll() is not None:
                raise SystemExit(f"the app exited with code {process.returncode}; see {log_dir / 'cold-start-app.log'}")
            report.peak_rss_mb = tree_mb("VmHWM", process.pid) or report.peak_rss_mb
            status = _status(client)  # {} while the server is busy starting: polled again below
            if status.get("error"):
                raise SystemExit(f"the app failed to start: {status['error']}")
            stage = status.get("engines_served")
            if status.get("ready") and stage != seen_stage:
                seen_stage = stage
                report.events.append(Event(now(), f"serving: {status.get('serving') or 'the complete engine'}",
                                           status.get("building", "")))
                seconds, result, error = _ask(client, question)
                if result is not None:
                    if report.first_answer_s is None:
                        report.first_answer_s = now()
                    report.events.append(Event(now(), f"answered in {seconds:.1f} s", _answer_summary(result)))
                else:
                    report.events.append(Event(now(), f"ask failed after {seconds:.1f} s", error))
                if status.get("complete"):
                    report.full_quality_s = report.events[-2].at_s
                    break
            time.sleep(POLL_S)
        report.peak_rss_mb = tree_mb("VmHWM", process.pid) or report.peak_rss_mb
    finally:
        _stop(process)
    if report.full_quality_s is None:
        return report
    return measure_warm(cache, question=question, log_dir=log_dir, report=report)


def measure_warm(cache: Path, *, question: str, log_dir: Path, report: ColdStart | None = None) -> ColdStart:
    """`python app.py` on a cache that holds everything: seconds to the first answer, and the peak memory."""
    report = report or ColdStart()
    process, url, now = _launch(cache, log_dir / "warm-start-app.log")
    try:
        client = _connect(url, process, 120)
        report.events.append(Event(now(), "warm start: the page serves"))
        while now() < 300:
            if report.warm_ready_s is None and _status(client).get("ready"):
                report.warm_ready_s = now()
                report.events.append(Event(now(), "warm start: the engine is ready"))
            seconds, result, _ = _ask(client, question)
            if result is not None:
                if report.warm_ready_s is None:
                    # Ready between two polls: the ask that answered was taken, so the engine was
                    # ready when it began.
                    report.warm_ready_s = now() - seconds
                    report.events.append(Event(report.warm_ready_s, "warm start: the engine is ready",
                                               "by the ask that answered"))
                report.warm_first_answer_s = now()
                report.events.append(Event(now(), "warm start: first answer", f"the ask itself {seconds:.1f} s"))
                break
            time.sleep(0.2)
        report.warm_peak_rss_mb = tree_mb("VmHWM", process.pid)
    finally:
        _stop(process)
    return report


def print_report(report: ColdStart) -> None:
    print(f"{'seconds':>8}  event")
    for event in report.events:
        print(f"{event.at_s:8.1f}  {event.what}" + (f"\n{'':>10}{event.detail}" if event.detail else ""))
    print()
    rows = [("first answer (cold)", report.first_answer_s, "s"), ("full quality (cold)", report.full_quality_s, "s"),
            ("engine ready (warm)", report.warm_ready_s, "s"), ("first answer (warm)", report.warm_first_answer_s, "s"),
            ("peak resident memory (cold)", report.peak_rss_mb, "MB"), ("peak resident memory (warm)", report.warm_peak_rss_mb, "MB")]
    for name, value, unit in rows:
        print(f"{name:<30} {'-' if value is None else f'{value:,.1f} {unit}'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cold_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, required=True, help="an empty or absent folder: the first start's cache")
    parser.add_argument("--warm", action="store_true", help="only a warm start, on a cache that already holds everything")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--timeout", type=float, default=3600, help="give up after this many seconds")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.warm:
        report = measure_warm(args.cache.resolve(), question=args.question, log_dir=args.cache.parent)
        print_report(report)
        return
    if args.cache.exists() and any(args.cache.iterdir()):
        parser.error(f"{args.cache} is not empty; a cold start needs an empty cache folder")
    args.cache.mkdir(parents=True, exist_ok=True)
    report = measure_cold(args.cache.resolve(), question=args.question, timeout_s=args.timeout, log_dir=args.cache.parent)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2))


if __name__ == "__main__":
    sys.exit(main())
