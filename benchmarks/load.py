"""Load test: N simulated visitors ask the running demo at once, over loopback, through its web API.

    python -m benchmarks.load --visitors 16 --duration 300                      # starts `python app.py` itself
    python -m benchmarks.load --url http://127.0.0.1:7860/ --visitors 16 --duration 300 --json load.json

Each visitor is its own `gradio_client.Client` (its own session) and asks distinct questions
carrying a visitor/ask marker; an answer whose `question` is not the one that visitor sent
counts as a leak. Meanwhile a sampler reads the server's resident memory from /proc once a
second. The run stops by itself after `--duration` seconds or `--max-asks` asks, or early on
Ctrl-C / SIGTERM (questions already in the queue then finish), and prints throughput, p50/p95 latency, errors, leaks, the
queue positions visitors were shown, and memory over time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rag_demo.serving.heap import status_mb

log = logging.getLogger(__name__)

QUESTIONS = (
    "who wrote notes on the state of virginia",
    "what is the capital of france",
    "who sang i will always love you first",
    "when was the first star wars movie released",
    "who played the joker in the dark knight",
    "what is the largest planet in the solar system",
    "who wrote the opening crawl for star wars",
    "where is the great barrier reef located",
    "who invented the telephone",
    "when did the titanic sink",
    "who is the author of pride and prejudice",
    "what is the longest river in africa",
)
POLL_S = 0.2  # how often a waiting visitor reads its queue status


@dataclass
class Ask:
    """One question a visitor sent and what came back."""

    visitor: int
    number: int
    started: float  # seconds since the run began
    latency_s: float
    ok: bool
    error: str = ""
    leak: bool = False  # the answer's question is not the one this visitor asked
    max_rank: int | None = None  # the largest queue position the visitor was shown (0 = running next)
    queue_size: int | None = None


@dataclass
class Sample:
    t: float  # seconds since the run began
    rss_mb: float
    asks_done: int
    load1: float


@dataclass
class Report:
    url: str
    visitors: int
    duration_s: float
    options: dict
    asks: list[Ask] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    server_pid: int | None = None
    cores: int = 0


def question_for(visitor: int, number: int) -> str:
    """A distinct question per visitor and ask; the marker lets the visitor recognise its own answer.

    >>> question_for(3, 7)
    'who is the author of pride and prejudice (visitor 3 ask 7)'
    """
    return f"{QUESTIONS[(visitor + number) % len(QUESTIONS)]} (visitor {visitor} ask {number})"


# -- the server's memory -----------------------------------------------------------------------------


def rss_mb(pid: int) -> float | None:
    """Resident memory of `pid` in MB (None once the process is gone)."""
    return status_mb("VmRSS", pid)


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(inode)
    return inodes


def pid_listening_on(port: int) -> int | None:
    """The process that listens on a TCP port, found through /proc (needs to see its file descriptors)."""
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in inodes:
                    return int(proc.name)
            except OSError:  # this descriptor closed while we looked; the others still count
                continue
    return None


def _port_of(url: str) -> int:
    from urllib.parse import urlparse

    parsed = urlparse(url)
    return parsed.port or (443 if parsed.scheme == "https" else 80)


# -- launching the app --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_app(port: int, log_path: Path) -> subprocess.Popen:
    """`python app.py` on 127.0.0.1:`port`, its output going to `log_path`."""
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), GRADIO_ANALYTICS_ENABLED="False")
    app = Path(__file__).resolve().parent.parent / "app.py"
    handle = log_path.open("w")
    return subprocess.Popen([sys.executable, str(app)], env=env, stdout=handle, stderr=subprocess.STDOUT,
                            cwd=app.parent, start_new_session=True)


def wait_until_ready(url: str, options: dict, timeout_s: float, process: subprocess.Popen | None = None) -> float:
    """Ask once, retrying until the complete engine answers (a first start builds in stages); returns seconds waited."""
    from gradio_client import Client

    started = time.monotonic()
    last = ""
    while time.monotonic() - started < timeout_s:
        if process is not None and process.poll() is not None:
            raise SystemExit(f"the app exited with code {process.returncode} before it was ready")
        try:
            client = Client(url, verbose=False, analytics_enabled=False, download_files=False)
            # a first start answers early, with parts still building: load only the complete engine
            if not client.predict(api_name="/status_json").get("complete"):
                raise RuntimeError("the engine is still building")
            client.predict("warm-up question: who wrote hamlet", *_ask_args(options), api_name="/ask_json")
            return time.monotonic() - started
        except Exception as err:  # not up yet: connection refused, or the engine still preparing
            last = f"{type(err).__name__}: {err}"
            time.sleep(2.0)
    raise SystemExit(f"the app at {url} did not answer within {timeout_s:.0f} s ({last})")


# -- visitors and sampler -----------------------------------------------------------------------------


def _ask_args(options: dict) -> tuple:
    return options["variant"], options["k"], options["index"], options["kb"]


class Run:
    """Shared bookkeeping of one load run; visitors and the sampler only append to it."""

    def __init__(self, report: Report, deadline: float, max_asks: int | None):
        self.report = report
        self.t0 = time.monotonic()
        self.deadline = deadline
        self.max_asks = max_asks
        self.lock = threading.Lock()
        self.sent = 0
        self.done = threading.Event()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def stop_sending(self) -> None:
        """No new questions from now on; the ones in flight finish and are counted."""
        self.deadline = 0.0

    def take_ticket(self) -> bool:
        """Whether a visitor may send another question (time and ask budget left)."""
        with self.lock:
            if time.monotonic() >= self.deadline or (self.max_asks is not None and self.sent >= self.max_asks):
                return False
            self.sent += 1
            return True

    def record(self, ask: Ask) -> None:
        with self.lock:
            self.report.asks.append(ask)


def visitor(run: Run, number: int, url: str, options: dict, timeout_s: float) -> None:
    from gradio_client import Client

    try:
        client = Client(url, verbose=False, analytics_enabled=False, download_files=False)
    except Exception as err:  # a visitor that cannot connect is an error of the run, not a crash of it
        run.record(Ask(number, 0, run.now(), 0.0, False, error=f"connect: {type(err).__name__}: {err}"))
        return
    count = 0
    while run.take_ticket():
        question = question_for(number, count)
        started = run.now()
        ask = Ask(number, count, started, 0.0, False)
        try:
            job = client.submit(question, *_ask_args(options), api_name="/ask_json")
            while not job.done():
                status = job.status()
                if status.rank is not None:
                    ask.max_rank = max(ask.max_rank or 0, int(status.rank))
                    ask.queue_size = max(ask.queue_size or 0, int(status.queue_size or 0))
                if run.now() - started > timeout_s:
                    raise TimeoutError(f"no answer after {timeout_s:.0f} s")
                time.sleep(POLL_S)
            result = job.result(timeout=timeout_s)
            ask.ok = True
            if not isinstance(result, dict) or result.get("question") != question:
                ask.ok, ask.leak = False, True
                ask.error = f"answer for another question: {str(result.get('question') if isinstance(result, dict) else result)[:80]!r}"
        except Exception as err:  # recorded per ask; the run goes on
            ask.error = f"{type(err).__name__}: {str(err)[:200]}"
        ask.latency_s = run.now() - started
        run.record(ask)
        count += 1


def sampler(run: Run, pid: int | None, every_s: float) -> None:
    while not run.done.is_set():
        rss = rss_mb(pid) if pid is not None else None
        with run.lock:
            done = len(run.report.asks)
        run.report.samples.append(Sample(round(run.now(), 2), round(rss, 1) if rss is not None else -1.0, done,
                                         os.getloadavg()[0]))
        run.done.wait(every_s)


# -- summary ------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 0.5), percentile([1.0, 2.0, 3.0, 4.0], 0.95)
    (2.0, 4.0)
    """
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, int(-(-q * len(ordered) // 1)))  # ceil(q * n)
    return ordered[min(rank, len(ordered)) - 1]


def memory_trend(samples: list[Sample], warmup_asks: int) -> dict:
    """RSS after warm-up and at the end, and the least-squares slope in MB per 100 asks after warm-up."""
    after = [s for s in samples if s.asks_done >= warmup_asks and s.rss_mb >= 0]
    if len(after) < 2:
        return {}
    xs, ys = [s.asks_done for s in after], [s.rss_mb for s in after]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0
    return {
        "warmup_asks": warmup_asks,
        "rss_after_warmup_mb": ys[0],
        "rss_end_mb": ys[-1],
        "rss_max_mb": max(ys),
        "rss_min_mb": min(ys),
        "growth_mb": round(ys[-1] - ys[0], 1),
        "slope_mb_per_100_asks": round(100 * slope, 2),
    }


def summarize(report: Report) -> dict:
    asks = report.asks
    ok = [a for a in asks if a.ok]
    latencies = [a.latency_s for a in ok]
    elapsed = max((a.started + a.latency_s for a in asks), default=0.0)
    ranks = [a.max_rank for a in asks if a.max_rank is not None]
    warmup = max(20, len(asks) // 10)
    return {
        "visitors": report.visitors,
        "asks": len(asks),
        "ok": len(ok),
        "errors": len(asks) - len(ok),
        "leaks": sum(a.leak for a in asks),
        "error_kinds": dict(Counter(a.error.split(":")[0] for a in asks if not a.ok)),
        "elapsed_s": round(elapsed, 1),
        "throughput_per_min": round(60 * len(ok) / elapsed, 2) if elapsed else 0.0,
        "latency_p50_s": round(percentile(latencies, 0.5), 2),
        "latency_p95_s": round(percentile(latencies, 0.95), 2),
        "latency_max_s": round(max(latencies), 2) if latencies else float("nan"),
        "asks_shown_a_queue_position": len(ranks),
        "max_queue_position": max(ranks) if ranks else None,
        "max_queue_size": max((a.queue_size or 0 for a in asks), default=0),
        "memory": memory_trend(report.samples, warmup),
        "load1_mean": round(statistics.fmean(s.load1 for s in report.samples), 2) if report.samples else None,
        "cores": report.cores,
        "options": report.options,
    }


def print_summary(summary: dict, samples: list[Sample], out=sys.stdout) -> None:
    w = out.write
    memory = summary["memory"]
    rows = [
        ("visitors", summary["visitors"]),
        ("asks (ok / errors / leaks)", f"{summary['asks']} ({summary['ok']} / {summary['errors']} / {summary['leaks']})"),
        ("elapsed", f"{summary['elapsed_s']} s"),
        ("throughput", f"{summary['throughput_per_min']} asks/min"),
        ("latency p50 / p95 / max", f"{summary['latency_p50_s']} / {summary['latency_p95_s']} / {summary['latency_max_s']} s"),
        ("asks shown a queue position", f"{summary['asks_shown_a_queue_position']} (largest {summary['max_queue_position']} of {summary['max_queue_size']})"),
        ("load average (1 min), cores", f"{summary['load1_mean']}, {summary['cores']}"),
    ]
    if memory:
        rows += [
            (f"RSS after {memory['warmup_asks']} warm-up asks / end / max", f"{memory['rss_after_warmup_mb']:.0f} / {memory['rss_end_mb']:.0f} / {memory['rss_max_mb']:.0f} MB"),
            ("RSS growth after warm-up", f"{memory['growth_mb']:+.1f} MB ({memory['slope_mb_per_100_asks']:+.2f} MB per 100 asks)"),
        ]
    if summary["error_kinds"]:
        rows.append(("error kinds", ", ".join(f"{k} x{v}" for k, v in summary["error_kinds"].items())))
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        w(f"{name:<{width}}  {value}\n")
    if samples:
        w("\nmemory over time (t s: RSS MB, asks done)\n")
        step = max(1, len(samples) // 12)
        w("  " + "  ".join(f"{s.t:.0f}: {s.rss_mb:.0f}, {s.asks_done}" for s in samples[::step]) + "\n")


# -- main ---------------------------------------------------------------------------------------------


def run_load(url: str, *, visitors: int, duration_s: float, max_asks: int | None, options: dict, pid: int | None,
             sample_every_s: float = 1.0, timeout_s: float = 600.0) -> Report:
    report = Report(url=url, visitors=visitors, duration_s=duration_s, options=options, server_pid=pid,
                    cores=os.cpu_count() or 0)
    run = Run(report, time.monotonic() + duration_s, max_asks)
    previous = {}
    if threading.current_thread() is threading.main_thread():  # Ctrl-C or SIGTERM: stop early, still report
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda *_: run.stop_sending())
    try:
        watcher = threading.Thread(target=sampler, args=(run, pid, sample_every_s), daemon=True)
        watcher.start()
        threads = [threading.Thread(target=visitor, args=(run, v, url, options, timeout_s), daemon=True)
                   for v in range(visitors)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(duration_s + timeout_s + 60)
        run.done.set()
        watcher.join(5)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return report


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.load", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="the running app (default: start `python app.py` on a free port)")
    parser.add_argument("--visitors", type=int, default=16)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds during which new questions are sent")
    parser.add_argument("--max-asks", type=int, default=None, help="stop sending after this many questions in all")
    parser.add_argument("--variant", default="both", choices=("token", "sequence", "both"))
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--index", default="flat")
    parser.add_argument("--kb", default="", help="knowledge base name (default: the app's first)")
    parser.add_argument("--pid", type=int, default=None, help="server process for memory samples (default: found by port)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one ask may take, queue included")
    parser.add_argument("--ready-timeout", type=float, default=1800.0, help="seconds to wait for a launched app")
    parser.add_argument("--json", default=None, help="also write the summary, every ask and every sample here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("httpx", "gradio_client"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if args.visitors < 1 or args.duration <= 0:
        print("benchmarks.load: --visitors must be at least 1 and --duration positive", file=sys.stderr)
        return 2
    options = {"variant": args.variant, "k": args.k, "index": args.index, "kb": args.kb}
    signal.signal(signal.SIGTERM, _interrupt)  # before the run starts, SIGTERM stops like Ctrl-C (the app is closed)
    process = None
    url = args.url
    try:
        if url is None:
            port = _free_port()
            url = f"http://127.0.0.1:{port}/"
            log_path = Path(args.json).with_suffix(".server.log") if args.json else Path(os.devnull)
            process = launch_app(port, log_path)
            log.info("started the app (pid %d) at %s; waiting for the engine", process.pid, url)
        waited = wait_until_ready(url, options, args.ready_timeout, process)
        log.info("the app answered after %.1f s", waited)
        pid = args.pid or (process.pid if process is not None else pid_listening_on(_port_of(url)))
        if pid is None:
            log.warning("could not find the server process listening on %s; memory is not sampled (pass --pid)", url)
        log.info("%d visitors for %.0f s%s", args.visitors, args.duration, f", at most {args.max_asks} asks" if args.max_asks else "")
        report = run_load(url, visitors=args.visitors, duration_s=args.duration, max_asks=args.max_asks, options=options,
                          pid=pid, timeout_s=args.timeout)
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
    summary = summarize(report)
    print_summary(summary, report.samples)
    if args.json:
        payload = {"summary": summary, "asks": [asdict(a) for a in report.asks], "samples": [asdict(s) for s in report.samples],
                   "url": url, "server_pid": report.server_pid}
        Path(args.json).write_text(json.dumps(payload, indent=1))
    return 0 if summary["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
