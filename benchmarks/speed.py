"""Speed: one run that measures every stage and compares against two references.

    python -m benchmarks.speed [--device cpu|cuda] [--json FILE] [--quick] [--skip SECTIONS]

Sections (each prints a table; `--json` writes them all):
- stages: encode, search per index variant, generate per variant, for k in `--ks`, medians over
  a fixed set of KB example questions (default models);
- indexes: every index variant on the real KB and on synthetic vectors (build time, bytes,
  recall@10 against flat, queries/s);
- kb build: passages embedded per second;
- vs transformers: our RAG-Token / RAG-Sequence against `RagTokenForGeneration.generate` /
  `RagSequenceForGeneration.generate` on one BART-shaped RAG model built from config (random
  weights) and the same passages; outputs must be identical; our time / theirs;
- vs plain loop: the default causal LM as a plain batched-docs + KV-cache greedy RAG-Token loop
  (full prompts, no shared few-shot cache, every position through the LM head); answers must
  be identical; plain time / ours;
- memory: peak RSS of a separate process that loads the demo's models and both KBs and answers.

`--quick` runs every section on tiny random models built from config (seconds, no cache needed);
the test suite uses it. A mismatch in an identity check is reported and makes the exit code 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from benchmarks.synthetic import QUICK_QUESTIONS, bpe_tokenizer, quick_engine, rag_parts, synthetic_vectors, wordpiece_tokenizer
from rag_demo.config import INDEX_KINDS, LIMITS, EngineConfig, IndexConfig
from rag_demo.retrieval.corpus import Passage, make_kb
from rag_demo.serving.heap import status_mb
from rag_demo.generation.kernels import stock_head

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]  # the memory probe's child runs `-m benchmarks.speed` from here


@dataclass(frozen=True)
class Sizes:
    """How much each section measures."""

    questions: int = 8  # fixed KB example questions for the stage latencies
    ks: tuple[int, ...] = (5, 10)
    max_new_tokens: int = 16
    synthetic_n: int = 1_000_000
    synthetic_dim: int = 768
    synthetic_queries: int = 100
    synthetic_clusters: int = 4096
    synthetic_index: IndexConfig = field(default_factory=lambda: IndexConfig(hnsw_m=16, hnsw_ef_construction=40, ivf_nlist=1024,
                                                                               pq_bytes=96, ivf_nprobe=16))
    synthetic_kinds: tuple[str, ...] = INDEX_KINDS
    synthetic_hnsw_n: int = 100_000  # HNSW is built on the first this many (1M takes ~15 min on 2 cores)
    embed_passages: int = 256
    hf_shape: str = "large"  # BART-shaped RAG: "large" (BartConfig() + DPRConfig()), "base" or "tiny"
    hf_questions: int = 3
    hf_k: int = 5
    hf_new_tokens: int = 16
    hf_passages: int = 2000
    baseline_questions: int = 8
    baseline_k: int = 5


QUICK = Sizes(questions=2, ks=(2, 3), max_new_tokens=6, synthetic_n=3000, synthetic_dim=32, synthetic_queries=20,
              synthetic_clusters=64, synthetic_hnsw_n=1000, synthetic_index=IndexConfig(hnsw_m=8, hnsw_ef_construction=20, ivf_nlist=16, pq_bytes=8),
              embed_passages=8, hf_shape="tiny", hf_questions=2, hf_k=3, hf_new_tokens=6, hf_passages=12,
              baseline_questions=2, baseline_k=3)


# -- helpers -----------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _fmt(value) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def table(rows: list[dict], columns: list[str]) -> str:
    """Rows as a Markdown table.

    >>> print(table([{"a": 1, "b": 2.5}], ["a", "b"]))
    | a | b |
    |---|---|
    | 1 | 2.5 |
    """
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "platform": platform.platform()}
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), platform.processor())
    except OSError:
        cpu = platform.processor()
    info["cpu"] = cpu
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def peak_rss_mb() -> float:
    """This process's resident-set high-water mark.

    /proc's VmHWM belongs to this program alone. getrusage's ru_maxrss survives exec, so a child
    started from a big process reports at least its parent's size at fork: it is only the fallback.
    """
    peak = status_mb("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def default_engine(device: torch.device, kb_paths: dict[str, str] | None = None):
    """The demo's default models; `kb_paths` (name -> folder) replaces the default KBs."""
    from rag_demo.serving.loading import engine_from_config

    return engine_from_config(EngineConfig(device=device.type), kb_paths=kb_paths)


# -- sections ----------------------------------------------------------------------------------
def stage_latencies(engine, sizes: Sizes) -> list[dict]:
    """Median ms per stage over the KB's example questions, for each k."""
    kb = engine.default_kb
    questions = engine.example_questions(kb, sizes.questions)
    device = engine.encoder.device
    engine.ask(questions[0], kb=kb, k=min(sizes.ks), variants=("token",), closed_book=False)  # warm-up
    rows = []
    for k in sizes.ks:
        encode, search = [], {kind: [] for kind in INDEX_KINDS}
        for q in questions:
            _sync(device)
            started = time.perf_counter()
            xq = engine.encoder.encode_questions([q])
            _sync(device)
            encode.append((time.perf_counter() - started) * 1000)
            query = xq.float().cpu().numpy()
            for kind in INDEX_KINDS:
                index = engine.search_index(kb, kind)
                index.search(query, k)  # warm (first use loads it)
                started = time.perf_counter()
                index.search(query, k)
                search[kind].append((time.perf_counter() - started) * 1000)
        rows.append({"k": k, "stage": "encode question", "median_ms": _median(encode)})
        rows += [{"k": k, "stage": f"search {kind}", "median_ms": _median(v)} for kind, v in search.items()]
        asks = {"generate RAG-Token": dict(variants=("token",), closed_book=False, memory=False),
                "generate RAG-Sequence fast": dict(variants=("sequence",), sequence_decoding="fast", closed_book=False,
                                                   memory=False),
                "generate RAG-Sequence thorough": dict(variants=("sequence",), sequence_decoding="thorough", closed_book=False,
                                                       memory=False),
                "ask: both variants + closed-book (the page's default)": {}}
        if engine.memory_logit() is not None:  # the generator's memory as one more source, beside the same asks without it
            asks |= {"generate RAG-Token, memory a source": dict(variants=("token",), closed_book=False, memory=True),
                     "generate RAG-Sequence thorough, memory a source": dict(variants=("sequence",), closed_book=False,
                                                                             sequence_decoding="thorough", memory=True)}
        generate = {label: [] for label in asks}
        total = {label: [] for label in asks}
        # question by question, every kind of ask in turn: a slow spell of a shared machine then
        # lands on all of them instead of on whichever ran in that minute
        for q in questions:
            for label, options in asks.items():
                result = engine.ask(q, kb=kb, k=k, max_new_tokens=sizes.max_new_tokens, **options)
                generate[label].append(result.timings_ms["generate"])
                total[label].append(result.timings_ms["total"])
        for label in asks:
            row = {"k": k, "stage": label, "ask_total_ms": _median(total[label])}
            if label.startswith("generate"):
                row["median_ms"] = _median(generate[label])
            without = label.removesuffix(", memory a source")
            if without != label:  # each question's time with memory over its time without, the median of those
                row["vs_without_memory"] = _median([a / b for a, b in zip(generate[label], generate[without])])
            rows.append(row)
    return rows




def index_variants(engine, sizes: Sizes, device: torch.device) -> list[dict]:
    """Every index variant on the real KB (engine's reports) and on synthetic vectors."""
    from rag_demo.retrieval.index import build_index, recall_at_k

    rows = []
    for name in engine.kb_names:
        for report in engine.index_reports(name, k=10):
            rows.append({"data": f"{name} ({report.num_vectors:,} x {engine.encoder.dim})", "index": report.kind,
                         "build_s": report.build_seconds, "bytes": report.bytes, "recall@10": report.recall_at_k,
                         "queries_per_s": 1000 / report.query_ms if report.query_ms else float("nan"), "batch": 1})
    started = time.perf_counter()
    xb = synthetic_vectors(sizes.synthetic_n, sizes.synthetic_dim, sizes.synthetic_clusters, seed=0)
    xq = synthetic_vectors(sizes.synthetic_queries, sizes.synthetic_dim, sizes.synthetic_clusters, seed=1)
    log.info("synthetic vectors in %.1f s", time.perf_counter() - started)
    k = 10
    exact: dict[int, np.ndarray] = {}
    plan = [("flat", sizes.synthetic_n)] + [(kind, sizes.synthetic_hnsw_n if kind == "hnsw" else sizes.synthetic_n)
                                             for kind in sizes.synthetic_kinds if kind != "flat"]
    for kind, n in plan:
        n = min(n, sizes.synthetic_n)
        if n not in exact:
            exact[n] = build_index("flat", xb[:n], sizes.synthetic_index, device=device).search(xq, k)[1]
        started = time.perf_counter()
        index = build_index(kind, xb[:n], sizes.synthetic_index, device=device if kind == "flat" else None)
        build = time.perf_counter() - started
        index.search(xq[:1], k)
        _sync(device)
        started = time.perf_counter()
        _, found = index.search(xq, k)
        _sync(device)
        batch_seconds = time.perf_counter() - started
        rows.append({"data": f"synthetic ({n:,} x {sizes.synthetic_dim})", "index": kind, "build_s": build, "bytes": index.nbytes,
                     "recall@10": recall_at_k(found, exact[n]), "queries_per_s": len(xq) / batch_seconds, "batch": len(xq)})
        log.info("synthetic %s on %d: build %.1f s", kind, n, build)
        del index
    return rows


def kb_build_throughput(engine, sizes: Sizes) -> list[dict]:
    kb = engine.kbs[engine.default_kb]
    n = min(sizes.embed_passages, len(kb))
    passages = [Passage(kb.titles[i], kb.texts[i]) for i in range(n)]
    engine.encoder.encode_passages(passages[: min(8, n)])  # warm-up
    _sync(engine.encoder.device)
    started = time.perf_counter()
    engine.encoder.encode_passages(passages, batch_size=64)
    _sync(engine.encoder.device)
    seconds = time.perf_counter() - started
    return [{"encoder": engine.encoder.name, "passages": n, "seconds": seconds, "passages_per_s": n / seconds}]


def _hf_setup(sizes: Sizes, folder: Path, device: torch.device, passages: list[Passage]):
    """A BART-shaped RAG model (both transformers classes) and our engine over the same modules and passages."""
    from transformers import RagConfig, RagSequenceForGeneration, RagTokenForGeneration

    from rag_demo.serving.loading import rag_engine_from_modules

    texts = [p.title + " " + p.text for p in passages]
    vocab = {"large": 50265, "base": 50265, "tiny": 300}[sizes.hf_shape]
    gen_tok = bpe_tokenizer(texts, folder / "bart", vocab)
    q_tok = wordpiece_tokenizer(texts, folder / "dpr", 30522 if sizes.hf_shape != "tiny" else 300)
    q_enc, bart = rag_parts(sizes.hf_shape, len(gen_tok), q_tok.vocab_size)
    q_enc, bart = q_enc.to(device), bart.to(device)
    # every input is cut to max_combined_length, so no row is padded: RagSequenceForGeneration.generate
    # drops the attention mask while making candidates, which only matters for padded rows
    shortest = min(len(gen_tok(p.title + " / " + p.text + " // ")["input_ids"]) for p in passages)
    rag_config = RagConfig.from_question_encoder_generator_configs(q_enc.config, bart.config, n_docs=sizes.hf_k,
                                                                   max_combined_length=min(300, shortest))
    token_model = RagTokenForGeneration(config=rag_config, question_encoder=q_enc, generator=bart).eval()
    sequence_model = RagSequenceForGeneration(config=rag_config, question_encoder=q_enc, generator=bart).eval()
    rng = np.random.default_rng(0)
    dim = q_enc.config.projection_dim or q_enc.config.hidden_size
    vectors = rng.standard_normal((len(passages), dim), dtype=np.float32)
    kb = make_kb("bart-shaped", passages, vectors, encoder="rag-question-encoder")
    engine = rag_engine_from_modules(question_encoder=q_enc, question_tokenizer=q_tok, generator_model=bart,
                                     generator_tokenizer=gen_tok, rag_config=rag_config, kbs={"bart-shaped": kb},
                                     config=EngineConfig(device=device.type))
    return engine, gen_tok, rag_config, token_model, sequence_model


def vs_transformers(sizes: Sizes, questions: list[str], passages: list[Passage], device: torch.device,
                    mismatches: list[str]) -> list[dict]:
    """Our decoding against transformers' RAG classes: identical outputs, our time / theirs."""
    with tempfile.TemporaryDirectory() as tmp:
        engine, gen_tok, rag_config, token_model, sequence_model = _hf_setup(sizes, Path(tmp), device, passages)
    k, new = sizes.hf_k, sizes.hf_new_tokens
    pad = gen_tok.pad_token_id
    rows = []
    for variant, model in (("token", token_model), ("sequence", sequence_model)):
        ours_ms, theirs_ms, same = [], [], 0
        for i, question in enumerate(questions + questions[:1]):  # the first question is repeated: warm-up
            retrieval = engine.retrieve(question, k=k)
            texts = [engine.generator.format_input(retrieval.generator_question, Passage(p.title, p.text)) for p in retrieval.passages]
            batch = gen_tok(texts, max_length=rag_config.max_combined_length, padding="max_length", truncation=True,
                            return_tensors="pt").to(device)
            scores = torch.tensor([[p.score for p in retrieval.passages]], device=device)
            result = engine.ask(question, k=k, variants=(variant,), max_new_tokens=new, closed_book=False,
                                sequence_decoding="thorough")
            _sync(device)
            started = time.perf_counter()
            with torch.inference_mode(), stock_head(model.generator):
                theirs = model.generate(context_input_ids=batch.input_ids, context_attention_mask=batch.attention_mask,
                                        doc_scores=scores, n_docs=k, num_beams=1, max_length=new + 1)
            _sync(device)
            seconds = time.perf_counter() - started
            expected = [t for t in theirs[0, 1:].tolist() if t != pad]
            ours = list(result.variants[variant].token_ids)
            if i == 0:
                continue
            ours_ms.append(result.timings_ms["generate"])
            theirs_ms.append(seconds * 1000)
            if ours == expected:
                same += 1
            else:
                mismatches.append(f"RAG-{variant} vs transformers on {question!r}: ours {ours}, theirs {expected}")
        ours_med, theirs_med = _median(ours_ms), _median(theirs_ms)
        rows.append({"variant": f"RAG-{variant.capitalize()} greedy" + (", thorough" if variant == "sequence" else ""),
                     "model": f"BART-{sizes.hf_shape}-shaped, random init", "k": k, "new_tokens": new,
                     "identical": f"{same}/{len(ours_ms)}", "ours_ms": ours_med, "transformers_ms": theirs_med,
                     "ours/theirs": ours_med / theirs_med})
    return rows


@torch.inference_mode()
def plain_rag_token(generator, texts: list[str], doc_lp: torch.Tensor, *, max_new_tokens: int) -> list[int]:
    """A plain greedy RAG-Token loop: the k full prompts as one left-padded batch with a KV cache.

    No shared few-shot cache, no packing, every prompt position through the LM head. Stops at
    the generator's stop tokens.
    """
    from rag_demo.marginalize import next_token_marginal

    tokenizer, model, device = generator.tokenizer, generator.model, generator.device
    rows = [tokenizer(t)["input_ids"] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True).logits[:, -1]
    doc_lp = doc_lp.to(device)
    answer: list[int] = []
    for _ in range(max_new_tokens):
        marginal = next_token_marginal(torch.log_softmax(logits.float(), -1)[None], doc_lp[None])[0]  # (V,)
        token = int(marginal.argmax())
        answer.append(token)
        if token in generator.stop_ids:
            break
        mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=torch.long, device=device)], dim=1)
        positions = positions[:, -1:] + 1
        logits = model(input_ids=torch.full((len(rows), 1), token, device=device), attention_mask=mask,
                       position_ids=positions, cache=cache, use_cache=True).logits[:, -1]
    return answer


def vs_plain_loop(engine, sizes: Sizes, mismatches: list[str]) -> list[dict]:
    """The engine's RAG-Token against `plain_rag_token` on the same passages: same answers, time ratio."""
    kb = engine.default_kb
    questions = engine.example_questions(kb, sizes.baseline_questions)
    device = engine.generator.device
    ours_ms, plain_ms, same = [], [], 0
    for i, question in enumerate(questions[:1] + questions):  # the first run warms up
        result = engine.ask(question, kb=kb, k=sizes.baseline_k, variants=("token",), closed_book=False,
                            max_new_tokens=sizes.max_new_tokens)
        retrieval = engine.retrieve(question, kb=kb, k=sizes.baseline_k)
        texts = [engine.generator.format_input(retrieval.generator_question, Passage(p.title, p.text)) for p in retrieval.passages]
        _sync(device)
        started = time.perf_counter()
        plain = plain_rag_token(engine.generator, texts, retrieval.doc_lp, max_new_tokens=sizes.max_new_tokens)
        _sync(device)
        seconds = time.perf_counter() - started
        if i == 0:
            continue
        ours_ms.append(result.timings_ms["generate"])
        plain_ms.append(seconds * 1000)
        if list(result.variants["token"].token_ids) == plain:
            same += 1
        else:
            mismatches.append(f"RAG-Token vs the plain loop on {question!r}: ours {list(result.variants['token'].token_ids)}, plain {plain}")
    ours_med, plain_med = _median(ours_ms), _median(plain_ms)
    return [{"generator": engine.generator.name, "k": sizes.baseline_k, "max_new_tokens": sizes.max_new_tokens,
             "identical": f"{same}/{len(ours_ms)}", "ours_ms": ours_med, "plain_ms": plain_med,
             "plain/ours": plain_med / ours_med}]


def memory_probe(quick: bool, device: torch.device, kb_paths: dict[str, str] | None = None) -> dict:
    """Run in a child process: load the demo's engine, import the page, answer on every KB and index.

    The heap is handled as `python app.py` handles it: two malloc arenas, free pages handed back
    after loading and after every ask (`rag_demo.serving.heap`)."""
    from rag_demo.serving import heap

    heap.limit_arenas(2)
    started = time.perf_counter()
    engine = quick_engine(Path(tempfile.mkdtemp()), device) if quick else default_engine(device, kb_paths)
    loaded = time.perf_counter() - started
    loaded_mb = peak_rss_mb()
    heap.release_free_memory()
    import gradio  # noqa: F401  (the page's weight in the process)

    import rag_demo.ui.page  # noqa: F401

    for name in engine.kb_names:
        question = (engine.example_questions(name, 1) or QUICK_QUESTIONS[:1])[0]
        for kind in INDEX_KINDS:
            engine.ask(question, kb=name, index=kind)
            heap.release_free_memory()
    default_peak = peak_rss_mb()
    # the largest ask the page allows: 20 passages, 6 beams, both variants and closed-book
    engine.ask(question, kb=name, k=min(LIMITS.max_k, len(engine.resolve_kb(name))), num_beams=LIMITS.max_beams)
    return {"kbs": list(engine.kb_names), "load_s": loaded, "after_load_mb": loaded_mb, "peak_mb": default_peak,
            "largest_ask_peak_mb": peak_rss_mb()}


def demo_memory(quick: bool, device: torch.device, kb_paths: dict[str, str] | None = None) -> list[dict]:
    command = [sys.executable, "-m", "benchmarks.speed", "--memory-probe", "--device", device.type] + (["--quick"] if quick else [])
    command += [f"--kb-path={name}={path}" for name, path in (kb_paths or {}).items()]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe failed: {done.stderr.strip().splitlines()[-1:]}")
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    return [{"process": "demo engine: models + " + " + ".join(probe["kbs"]) + ", gradio imported, one ask per KB and index",
             "load_s": probe["load_s"], "rss_after_load_mb": probe["after_load_mb"], "peak_rss_mb": probe["peak_mb"],
             "peak_after_largest_ask_mb": probe["largest_ask_peak_mb"]}]


SECTIONS = {
    "stages": ["k", "stage", "median_ms", "ask_total_ms", "vs_without_memory"],
    "indexes": ["data", "index", "build_s", "bytes", "recall@10", "queries_per_s", "batch"],
    "kb_build": ["encoder", "passages", "seconds", "passages_per_s"],
    "vs_transformers": ["variant", "model", "k", "new_tokens", "identical", "ours_ms", "transformers_ms", "ours/theirs"],
    "vs_plain_loop": ["generator", "k", "max_new_tokens", "identical", "ours_ms", "plain_ms", "plain/ours"],
    "memory": ["process", "load_s", "rss_after_load_mb", "peak_rss_mb", "peak_after_largest_ask_mb"],
}


def run(sizes: Sizes, device: torch.device, *, quick: bool, skip: tuple[str, ...] = (),
        kb_paths: dict[str, str] | None = None) -> dict:
    """Every section; returns {"machine", "sizes", section: rows..., "mismatches"}."""
    report: dict = {"machine": machine(), "device": device.type, "sizes": asdict(sizes), "mismatches": []}
    mismatches: list[str] = report["mismatches"]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        engine = quick_engine(Path(tmp), device) if quick else default_engine(device, kb_paths)
    report["engine_load_s"] = time.perf_counter() - started
    steps = {
        "stages": lambda: stage_latencies(engine, sizes),
        "vs_plain_loop": lambda: vs_plain_loop(engine, sizes, mismatches),
        "vs_transformers": lambda: vs_transformers(sizes, _hf_questions(engine, sizes, quick), _hf_passages(engine, sizes, quick),
                                                   device, mismatches),
        "kb_build": lambda: kb_build_throughput(engine, sizes),
        "memory": lambda: demo_memory(quick, device, kb_paths),
        "indexes": lambda: index_variants(engine, sizes, device),  # last: the synthetic part is the longest
    }
    for name, step in steps.items():
        if name in skip:
            continue
        section_started = time.perf_counter()
        report[name] = step()
        report[f"{name}_s"] = time.perf_counter() - section_started
        print(f"\n## {name} ({report[f'{name}_s']:.0f} s)\n\n{table(report[name], SECTIONS[name])}", flush=True)
    return report


def _hf_questions(engine, sizes: Sizes, quick: bool) -> list[str]:
    return (QUICK_QUESTIONS if quick else engine.example_questions(engine.default_kb, 16))[: sizes.hf_questions]


def _hf_passages(engine, sizes: Sizes, quick: bool) -> list[Passage]:
    kb = engine.kbs[engine.default_kb]
    if quick:
        return [Passage(t, x) for t, x in zip(kb.titles, kb.texts)][: sizes.hf_passages]
    long_enough = [i for i, text in enumerate(kb.texts) if len(text.split()) >= 60]
    return [Passage(kb.titles[i], kb.texts[i]) for i in long_enough[: sizes.hf_passages]]


def finish(report: dict, json_path: str | None) -> int:
    """Write the report (when asked) and turn its identity checks into the exit status."""
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2, default=str))
    if report["mismatches"]:
        print("\nIDENTITY CHECKS FAILED:\n" + "\n".join(report["mismatches"]), file=sys.stderr)
        return 1
    print("\nall identity checks passed")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speed", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--json", metavar="FILE", help="also write every number to FILE")
    parser.add_argument("--quick", action="store_true", help="tiny random models and sizes (seconds; used by the tests)")
    parser.add_argument("--skip", default="", help=f"comma-separated sections to leave out: {', '.join(SECTIONS)}")
    parser.add_argument("--questions", type=int)
    parser.add_argument("--synthetic-n", type=int, help="synthetic vectors for the index table (default 1,000,000)")
    parser.add_argument("--synthetic-kinds", help="index kinds on the synthetic vectors (default flat,hnsw,ivfpq)")
    parser.add_argument("--synthetic-hnsw-n", type=int, help="vectors HNSW is built on (default 100,000)")
    parser.add_argument("--baseline-questions", type=int, help="questions for the plain-loop comparison (default 8)")
    parser.add_argument("--hf-questions", type=int, help="questions for the transformers comparison (default 3)")
    parser.add_argument("--hf-shape", choices=("large", "base", "tiny"))
    parser.add_argument("--hf-k", type=int)
    parser.add_argument("--hf-new-tokens", type=int)
    parser.add_argument("--kb-path", action="append", default=[], metavar="NAME=FOLDER",
                        help="use these KB folders instead of the default KBs (repeatable)")
    parser.add_argument("--memory-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda was asked for but no CUDA GPU is visible")
    kb_paths = dict(item.split("=", 1) for item in args.kb_path) or None
    if args.memory_probe:
        print(json.dumps(memory_probe(args.quick, device, kb_paths)))
        return 0
    sizes = QUICK if args.quick else Sizes()
    overrides = {"questions": args.questions, "synthetic_n": args.synthetic_n, "hf_shape": args.hf_shape, "hf_k": args.hf_k,
                 "hf_new_tokens": args.hf_new_tokens,
                 "synthetic_hnsw_n": args.synthetic_hnsw_n, "baseline_questions": args.baseline_questions,
                 "hf_questions": args.hf_questions,
                 "synthetic_kinds": tuple(args.synthetic_kinds.split(",")) if args.synthetic_kinds else None}
    sizes = replace(sizes, **{key: value for key, value in overrides.items() if value is not None})
    skip = tuple(s for s in args.skip.split(",") if s)
    unknown = [s for s in skip if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section {unknown[0]!r}; choose from {', '.join(SECTIONS)}")
    print(f"machine: {json.dumps(machine())}", flush=True)
    report = run(sizes, device, quick=args.quick, skip=skip, kb_paths=kb_paths)
    return finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
