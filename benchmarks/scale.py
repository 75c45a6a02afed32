"""Knowledge bases far larger than the demo's: build, size, memory, latency and recall per index.

    python -m benchmarks.scale [--sizes 10k,100k,1m] [--kinds flat,hnsw,ivfpq,bm25] [--data DIR] [--json FILE]
    python -m benchmarks.scale --from-json FILE[,FILE]     # the tables again, from rows saved by --json

For each size N a synthetic KB of N passages is written the way a large KB is kept (titles and
texts as a `datasets` folder, 384-dim float16 vectors in a memory-mapped embeddings.npy); the
vectors are drawn around topic centres (`benchmarks.synthetic.synthetic_vectors`) so that recall
against exact search means something, and each text is 100 words drawn from a Zipf law over
4M words (`synthetic_texts`), so that BM25's postings are as skewed as a real corpus's.
Then, per index variant, two child processes:

- build: builds the index over the memory-mapped vectors and caches it beside the KB
  (build seconds, bytes on disk, the build's peak resident memory);
- serve: loads the KB and the cached index (memory-mapped), answers `--queries` questions one
  at a time (batch 1) and reports the median ms per question, recall@10 against exact search,
  and VmRSS / VmHWM / RssAnon from /proc/self/status at the end.

A child per configuration keeps one configuration's memory out of the next one's figures.
flat is the chunked exact search over the memory-mapped float16 vectors (nothing to build; its
bytes are the vectors file); ivfpq re-ranks its candidates with exact products read from that
file (`--reranks`: one row per number of candidates, 0 for the codes' own ranking). HNSW is
skipped above `--hnsw-max` rows (its build is the slow one on 2 cores).

bm25 gets a table of its own: the build child builds the KB's BM25 index and saves it in the KB
folder (`LexicalIndex.for_kb_folder`), and also measures what its vocabulary would take as a
Python dict; the serve child opens it memory-mapped and answers `--queries` questions of 6 words
drawn from a random passage each ("source in top 10": how often that passage is among BM25's
top 10).

Last, each index's cost at the paper's 21M x 768 is extrapolated from its row at the largest N
measured (`extrapolate`, which says how each one scales), next to the exact-search figures
reported for one H200.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # children run `-m benchmarks.scale` from here

log = logging.getLogger("scale")

KINDS = ("flat", "hnsw", "ivfpq", "bm25")
K = 10
ZIPF_WORDS = 1 << 22  # the synthetic language's words; 1M passages use 3.1M of them
ZIPF_EXPONENT = 1.1  # word frequency ~ 1 / rank^1.1


@dataclass(frozen=True)
class Plan:
    dim: int = 384
    per_topic: int = 250  # passages per topic centre (N // 250 centres), so a question's neighbours share its topic
    queries: int = 100
    block: int = 100_000  # vectors drawn and written per block
    hnsw_max: int = 1_000_000  # larger KBs skip HNSW: its build took 4-6 min at 1M rows on 2 cores, and grows faster than N
    reranks: tuple[int, ...] = (0, 100)  # IVF-PQ served as its codes rank (0) and with this many candidates re-scored
    words: int = 100  # per synthetic passage, as DPR's passages
    language: int = ZIPF_WORDS  # words the passages are drawn from
    question_words: int = 6  # per BM25 question, drawn from one passage


def parse_size(text: str) -> int:
    """'10k' -> 10000, '1m' -> 1000000, '2500' -> 2500."""
    text = text.strip().lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def index_config(n: int, kind: str, *, rerank: int = 100):
    """Index parameters for N rows. IVF-PQ aims at < 50 ms, recall@10 >= 0.9, < 3 GB at 1M on 2 cores:
    1024 lists (256 below 100k, 4096 from 2M, so that a probed list stays about a thousand rows),
    48-byte codes (8 dims each), 32 lists probed, 64 training rows per list (a k-means over all of
    1M rows would take longer than everything else), and the best `rerank` candidates re-scored
    with the float16 vectors (re-ranking does not change the index)."""
    from rag_demo.config import IndexConfig

    if kind != "ivfpq":
        return IndexConfig()
    nlist = 4096 if n >= 2_000_000 else 1024 if n >= 100_000 else 256
    return IndexConfig(ivf_nlist=nlist, pq_bytes=48, ivf_nprobe=32, ivf_train_rows=64 * nlist, ivf_rerank=rerank)


def topics(n: int, plan: Plan) -> int:
    return max(16, n // plan.per_topic)


def memory_mb() -> dict:
    from rag_demo.serving.heap import status_mb

    return {field: status_mb(field) for field in ("VmRSS", "VmHWM", "RssAnon")}


# -- data ------------------------------------------------------------------------------------------
def spelled(rank: int) -> str:
    """A word for a rank: base 26 in letters, two or more of them, so frequent words are short.

    >>> spelled(0), spelled(1), spelled(26 * 26 - 26)
    ('ba', 'bb', 'baa')
    """
    letters = ""
    rank += 26
    while rank:
        rank, digit = divmod(rank, 26)
        letters = chr(ord("a") + digit) + letters
    return letters


@functools.lru_cache(maxsize=1)
def zipf_language(size: int = ZIPF_WORDS, exponent: float = ZIPF_EXPONENT):
    """(words, cdf): `size` words by rank and the cumulative probability of ranks 0..size-1."""
    import numpy as np

    cdf = np.cumsum(np.arange(1, size + 1, dtype=np.float64) ** -exponent)
    return [spelled(rank) for rank in range(size)], cdf / cdf[-1]


def synthetic_texts(n: int, *, seed: int, words: int = 100, language: int = ZIPF_WORDS) -> list[str]:
    """n texts of `words` words drawn from `language` by Zipf's law; text i is the same whatever n
    (drawn in blocks of 10,000)."""
    import numpy as np

    language, cdf = zipf_language(language)
    texts = []
    for block in range(0, n, 10_000):
        ranks = np.searchsorted(cdf, np.random.default_rng([seed, block]).random((10_000, words)))  # (10000, words)
        texts += [" ".join([language[r] for r in row]) for row in ranks[: n - block].tolist()]
    return texts


def ensure_kb(folder: Path, n: int, plan: Plan) -> Path:
    """A synthetic KB of n passages at folder (written once, then reused), without its BM25 index."""
    from benchmarks.synthetic import synthetic_vectors
    from rag_demo.retrieval.corpus import KB_META, write_kb

    meta = folder / KB_META
    if meta.is_file() and json.loads(meta.read_text()).get("count") == n:
        return folder
    started = time.perf_counter()
    blocks = (synthetic_vectors(min(plan.block, n - start), plan.dim, topics(n, plan), seed=1000 + start // plan.block)
              for start in range(0, n, plan.block))
    write_kb(folder, name=f"synthetic-{n}", titles=[f"passage {i}" for i in range(n)],
             texts=synthetic_texts(n, seed=7, words=plan.words, language=plan.language), vectors=blocks, dim=plan.dim, dtype="float16", bm25=False)
    log.info("wrote %s in %.0f s", folder, time.perf_counter() - started)
    return folder


def ensure_queries(path: Path, n: int, plan: Plan) -> Path:
    """Questions drawn around the same topic centres as the KB of n passages (another seed)."""
    import numpy as np

    from benchmarks.synthetic import synthetic_vectors

    if not path.is_file():
        np.save(path, synthetic_vectors(plan.queries, plan.dim, topics(n, plan), seed=1))
    return path


# -- children ----------------------------------------------------------------------------------------
def child_build(spec: dict) -> dict:
    """Build one index over the KB's memory-mapped vectors and cache it beside the KB."""
    from rag_demo.retrieval.corpus import load_kb
    from rag_demo.retrieval.index import cached_index

    kb = load_kb(spec["kb"])
    index = cached_index(spec["kind"], kb.embeddings, kb.fingerprint, Path(spec["kb"]) / "indexes",
                         index_config(len(kb), spec["kind"]))
    return {"build_s": index.build_seconds if spec["kind"] != "flat" else None, "bytes": index.nbytes,
            "build_peak_mb": memory_mb()["VmHWM"]}


def child_serve(spec: dict) -> dict:
    """Load the KB and its cached index, answer each question alone, score recall against exact."""
    import numpy as np

    from rag_demo.retrieval.corpus import load_kb
    from rag_demo.retrieval.index import cached_index, recall_at_k

    kb = load_kb(spec["kb"])
    index = cached_index(spec["kind"], kb.embeddings, kb.fingerprint, Path(spec["kb"]) / "indexes",
                         index_config(len(kb), spec["kind"], rerank=spec.get("rerank", 100)))
    xq = np.load(spec["queries"])
    index.search(xq[:1], K)  # first touch: code paths and the index's first pages
    times, found = [], []
    for row in xq:
        started = time.perf_counter()
        _, ids = index.search(row[None], K)
        times.append((time.perf_counter() - started) * 1000)
        found.append(ids[0])
    found = np.stack(found)
    exact_path = Path(spec["exact"])
    if spec["kind"] == "flat" and not exact_path.is_file():
        np.save(exact_path, index.search(xq, K)[1])  # the batch answer is the reference for the others
    exact = np.load(exact_path)
    # titles and texts of the answers, read as an ask would (from the Arrow file for large KBs)
    shown = [kb.passage(int(i)) for i in found[0] if i >= 0]
    return {"ms_per_question": statistics.median(times), "recall_at_10": recall_at_k(found, exact),
            "shown": len(shown), **memory_mb()}


def anon_peak(stop: threading.Event, seen: list[float]) -> None:
    """Sample RssAnon every 20 ms until stopped. VmHWM also counts file pages the build wrote
    through a mapping, which the kernel can write back and drop; anonymous memory it cannot."""
    from rag_demo.serving.heap import status_mb

    while not stop.wait(0.02):
        seen.append(status_mb("RssAnon") or 0.0)


def child_build_bm25(spec: dict) -> dict:
    """Build the KB's BM25 index and save it in the KB folder."""
    import shutil

    from rag_demo.retrieval.corpus import load_kb
    from rag_demo.retrieval.lexical import LexicalIndex, lexical_path

    kb = load_kb(spec["kb"])
    shutil.rmtree(lexical_path(kb.path), ignore_errors=True)
    stop, seen = threading.Event(), [memory_mb()["RssAnon"]]
    sampler = threading.Thread(target=anon_peak, args=(stop, seen), daemon=True)
    sampler.start()
    started = time.perf_counter()
    index = LexicalIndex.for_kb_folder(kb.path, kb.titles, kb.texts, fingerprint=kb.fingerprint, max_postings=None)
    stop.set()
    sampler.join()
    built = {"build_s": time.perf_counter() - started, "build_peak_mb": memory_mb()["VmHWM"], "build_anon_peak_mb": max(seen),
             "bytes": sum(f.stat().st_size for f in lexical_path(kb.path).iterdir()),
             "terms": len(index.vocabulary), "postings": len(index.docs),
             "vocabulary_bytes": sum(a.nbytes for a in (index.vocabulary.term_bytes, index.vocabulary.term_starts,
                                                       index.vocabulary.term_ids))}
    return built


def child_serve_bm25(spec: dict) -> dict:
    """Open the KB and its saved BM25 index, answer each question alone; then what its vocabulary
    would take as a Python dict (measured here: the build child's freed objects would hide it)."""
    import numpy as np

    from rag_demo.retrieval.corpus import load_kb
    from rag_demo.serving.heap import status_mb
    from rag_demo.retrieval.lexical import LexicalIndex

    kb = load_kb(spec["kb"])
    started = time.perf_counter()
    # max_postings=0: a saved index that did not fit would be refused, never silently rebuilt and timed as an open
    index = LexicalIndex.for_kb_folder(kb.path, kb.titles, kb.texts, fingerprint=kb.fingerprint, max_postings=0)
    open_ms = (time.perf_counter() - started) * 1000
    rng = np.random.default_rng(1)
    sources = rng.choice(len(kb), size=min(spec["queries"], len(kb)), replace=False).tolist()
    questions = [" ".join(rng.choice(kb.texts[row].split(), size=spec["question_words"], replace=False)) for row in sources]
    index.top(questions[0], K)  # first touch: code paths
    times, hits = [], 0
    for row, question in zip(sources, questions):
        started = time.perf_counter()
        top = index.top(question, K)
        times.append((time.perf_counter() - started) * 1000)
        hits += row in top.tolist()
    served = {"open_ms": open_ms, "ms_per_question": statistics.median(times), "source_at_10": hits / len(sources),
              **memory_mb()}
    before = status_mb("VmRSS")
    as_dict = dict(zip(index.vocabulary, range(len(index.vocabulary))))  # str keys, int values: what a build holds
    served["dict_mb"] = status_mb("VmRSS") - before
    del as_dict
    return served


def run_child(role: str, spec: dict, timeout: float) -> dict:
    """Run one child (`role` build or serve) in a fresh interpreter; its last stdout line is JSON."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.scale", "--child", role, json.dumps(spec)], capture_output=True,
                         text=True, cwd=ROOT, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{role} {spec['kind']} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- table ---------------------------------------------------------------------------------------
def _mb(value) -> str:
    return "—" if value is None else f"{value:,.0f}"


def table(rows: list[dict]) -> str:
    head = ("| N | index | build s | bytes on disk | build peak MB | VmRSS MB | VmHWM MB | RssAnon MB | ms / question | recall@10 |\n"
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {r['n']:,} | {r['kind']} | {r['skipped']} | | | | | | | |")
            continue
        build = "—" if r["build_s"] is None else f"{r['build_s']:.1f}"
        lines.append(f"| {r['n']:,} | {r['label']} | {build} | {r['bytes']:,} | {_mb(r['build_peak_mb'])} | {_mb(r['VmRSS'])} | "
                     f"{_mb(r['VmHWM'])} | {_mb(r['RssAnon'])} | {r['ms_per_question']:.1f} | {r['recall_at_10']:.3f} |")
    return "\n".join(lines)


def bm25_table(rows: list[dict]) -> str:
    head = ("| N | terms | postings | build s | build peak MB | build RssAnon peak MB | bytes on disk | "
            "vocabulary MB: arrays / as a dict | open ms | VmRSS MB | VmHWM MB | RssAnon MB | ms / question | source in top 10 |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['n']:,} | {r['terms']:,} | {r['postings']:,} | {r['build_s']:.1f} | {_mb(r['build_peak_mb'])} | "
                     f"{_mb(r['build_anon_peak_mb'])} | "
                     f"{r['bytes']:,} | {r['vocabulary_bytes'] / 2**20:,.0f} / {r['dict_mb']:,.0f} | {r['open_ms']:.1f} | "
                     f"{_mb(r['VmRSS'])} | {_mb(r['VmHWM'])} | {_mb(r['RssAnon'])} | {r['ms_per_question']:.1f} | "
                     f"{r['source_at_10']:.2f} |")
    return "\n".join(lines)


# -- extrapolation -----------------------------------------------------------------------------------
PAPER_ROWS, PAPER_DIM = 21_000_000, 768  # DPR's Wikipedia passages and vectors
PAPER_PQ_BYTES = 96  # the same 8 dims per code byte at 768 dims (the paper's compressed index used 64-128)
# Exact search measured on one H200 with synthetic 21M x 768 float16 vectors, 4.19 TB/s copy bandwidth,
# as the issue that asked for this table reports them; not run by this script.
H200_MS = {1: 8.0, 32: 13.7}


def extrapolate(rows: list[dict], *, n: int = PAPER_ROWS, dim: int = PAPER_DIM) -> list[dict]:
    """Each index's cost at n x dim, scaled from its row at the largest N measured here.

    flat and bm25 read every row (or every posting of the question's words) per question, so their
    time and bytes grow with N x D (bm25: N). IVF-PQ is taken with its lists grown with N (rows per
    list as measured) and 8 dims per code byte: a question scans as many codes as measured, each
    dim / D times as long; its files hold N codes and ids. HNSW holds every vector in float32 plus
    its graph (the graph bytes per row as measured). Resident memory is the measured RssAnon where
    the index is read from mapped files (flat, IVF-PQ, bm25) and the whole file for HNSW's build."""
    out = []
    largest = {}
    for r in rows:
        if r.get("skipped"):
            continue
        key = r.get("label", r["kind"])
        if r["n"] >= largest.get(key, {}).get("n", 0):
            largest[key] = r
    for key, r in largest.items():
        grow_rows, grow_dim = n / r["n"], dim / r.get("dim", 384)
        row = {"index": key, "from_n": r["n"]}
        if r["kind"] == "flat":
            row |= {"bytes": n * dim * 2, "ms_per_question": r["ms_per_question"] * grow_rows * grow_dim,
                    "resident_mb": r["RssAnon"], "note": "reads every row per question"}
        elif r["kind"] == "ivfpq":
            codes = PAPER_PQ_BYTES if dim == PAPER_DIM else round(r.get("pq_bytes", 48) * grow_dim)
            row |= {"bytes": n * (codes + 8), "ms_per_question": r["ms_per_question"] * grow_dim,
                    "resident_mb": r["RssAnon"], "note": f"{codes} B codes, lists grown with N; re-ranking reads its rows"}
        elif r["kind"] == "hnsw":
            graph = r["bytes"] / r["n"] - r.get("dim", 384) * 4
            row |= {"bytes": int(n * (dim * 4 + graph)), "ms_per_question": None,
                    "resident_mb": n * (dim * 4 + graph) / 2**20, "note": "built in memory: every vector in float32 and the graph"}
        elif r["kind"] == "bm25":
            row |= {"bytes": int(r["bytes"] * grow_rows), "ms_per_question": r["ms_per_question"] * grow_rows,
                    "resident_mb": r["RssAnon"], "note": "postings grow with N; a question scores every posting of its words"}
        out.append(row)
    for batch, ms in H200_MS.items():
        out.append({"index": f"flat on one H200, batch {batch} (reported, not run here)", "from_n": n, "bytes": n * dim * 2,
                    "ms_per_question": ms, "resident_mb": None, "note": "float16 on the GPU"})
    return out


def extrapolation_table(rows: list[dict], *, n: int = PAPER_ROWS, dim: int = PAPER_DIM) -> str:
    lines = [f"Extrapolated to {n:,} x {dim} from the largest N measured (2 CPU cores unless the row says otherwise):", "",
             "| index | from N | bytes | resident MB | ms / question | how |", "|---|---:|---:|---:|---:|---|"]
    for r in extrapolate(rows, n=n, dim=dim):
        ms = "—" if r["ms_per_question"] is None else f"{r['ms_per_question']:,.1f}"
        lines.append(f"| {r['index']} | {r['from_n']:,} | {r['bytes'] / 1e9:,.1f} GB | {_mb(r['resident_mb'])} | {ms} | {r['note']} |")
    return "\n".join(lines)


def label(n: int, kind: str, *, rerank: int = 100) -> str:
    config = index_config(n, kind, rerank=rerank)
    if kind == "flat":
        return "flat (fp16 memmap, chunks)"
    if kind == "hnsw":
        return f"hnsw (M {config.hnsw_m}, efC {config.hnsw_ef_construction}, efS {config.hnsw_ef_search})"
    return f"ivfpq ({config.ivf_nlist} lists, {config.pq_bytes} B, nprobe {config.ivf_nprobe}, rerank {config.ivf_rerank})"


def run(sizes: list[int], kinds: list[str], data: Path, plan: Plan, *, timeout: float) -> list[dict]:
    rows = []
    for n in sizes:
        kb = ensure_kb(data / f"kb-{n}-{plan.dim}-zipf", n, plan)
        queries = ensure_queries(data / f"queries-{n}-{plan.dim}-{plan.queries}.npy", n, plan)
        exact = data / f"exact-{n}-{plan.dim}-{plan.queries}.npy"
        dense = [k for k in kinds if k != "bm25"]
        for kind in ["flat"] + [k for k in dense if k != "flat"] if dense else []:  # flat first: it writes the exact answers
            if kind == "hnsw" and n > plan.hnsw_max:
                rows.append({"n": n, "kind": kind, "skipped": f"not built above {plan.hnsw_max:,} rows (--hnsw-max)"})
                continue
            spec = {"kb": str(kb), "kind": kind, "queries": str(queries), "exact": str(exact)}
            started = time.perf_counter()
            built = run_child("build", spec, timeout)
            for rerank in plan.reranks if kind == "ivfpq" else (0,):
                served = run_child("serve", {**spec, "rerank": rerank}, timeout)
                if kind != "flat" or "flat" in kinds:
                    rows.append({"n": n, "dim": plan.dim, "kind": kind, "label": label(n, kind, rerank=rerank),
                                 "pq_bytes": index_config(n, kind).pq_bytes, **built, **served})
            log.info("N=%d %s done in %.0f s", n, kind, time.perf_counter() - started)
        if "bm25" in kinds:
            spec = {"kb": str(kb), "kind": "bm25", "queries": plan.queries, "question_words": plan.question_words}
            started = time.perf_counter()
            rows.append({"n": n, "dim": plan.dim, "kind": "bm25", **run_child("build-bm25", spec, timeout),
                         **run_child("serve-bm25", spec, timeout)})
            log.info("N=%d bm25 done in %.0f s", n, time.perf_counter() - started)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10k,100k,1m", help="comma-separated KB sizes (10k, 100k, 1m, or plain numbers)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="index variants (default flat,hnsw,ivfpq)")
    parser.add_argument("--data", default=None, help="folder for the synthetic KBs and indexes (default: a temporary one)")
    parser.add_argument("--queries", type=int, default=Plan.queries)
    parser.add_argument("--hnsw-max", type=int, default=Plan.hnsw_max, help="skip HNSW above this many rows")
    parser.add_argument("--reranks", default=",".join(map(str, Plan.reranks)),
                        help="IVF-PQ candidates re-scored exactly, one table row each (0: the codes' ranking)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--from-json", default=None, help="print the tables of rows an earlier run wrote with --json "
                        "(several files: comma-separated), measuring nothing")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        role, spec = args.child
        children = {"build": child_build, "serve": child_serve, "build-bm25": child_build_bm25, "serve-bm25": child_serve_bm25}
        print(json.dumps(children[role](json.loads(spec))))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if unknown := [k for k in kinds if k not in KINDS]:
        parser.error(f"unknown index kind(s) {', '.join(unknown)}; choose from {', '.join(KINDS)}")
    plan = replace(Plan(), queries=args.queries, hnsw_max=args.hnsw_max,
                   reranks=tuple(int(r) for r in args.reranks.split(",") if r.strip()))
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if args.from_json:
        rows = [row for path in args.from_json.split(",") for row in json.loads(Path(path).read_text())["rows"]]
    else:
        with tempfile.TemporaryDirectory(prefix="rag-scale-") as scratch:
            data = Path(args.data) if args.data else Path(scratch)
            data.mkdir(parents=True, exist_ok=True)
            rows = run(sizes, kinds, data, plan, timeout=args.timeout)
    dense, bm25 = [r for r in rows if r["kind"] != "bm25"], [r for r in rows if r["kind"] == "bm25"]
    print("\n\n".join(([table(dense)] if dense else []) + ([bm25_table(bm25)] if bm25 else []) + [extrapolation_table(rows)]))
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps({"plan": asdict(plan), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
