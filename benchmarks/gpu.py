"""GPU speed check in one run: bandwidth, exact search at Wikipedia scale, a full-scale question,
and our RAG-Token against transformers' on the same BART-large-shaped model.

    python -m benchmarks.gpu [--json FILE]               # on the GPU machine (one H200), from the repository root
    python -m benchmarks.gpu --tiny --device cpu         # the same logic at toy sizes (tests)

Needs only the repository tree, torch and transformers (no faiss, no Hub, nothing downloaded,
nothing installed): every model is random-init from its config with the real shapes, tokenizers
are trained on generated text, the index is random fp16 vectors.

Sections:
- copy: device-to-device copy bandwidth (bytes read + written per second);
- search: exact inner-product top-10 over N x 768 fp16 vectors, batch 1 and 32, against the
  floor bytes(index) / copy bandwidth: the float16 scan alone (torch matmul + top-k, chunked) and
  the engine's flat search (`flat.search_placed`: the scan, then its best k + 32 rows re-scored
  in float32 and returned to the host);
- question: DPR (BERT-base) question encoder -> search N -> BART-large RAG-Token greedy, k=10,
  20 new tokens, end to end per question (fp16 weights);
- vs transformers: `RagTokenForGeneration.generate` against our engine on the same float32
  model and passages (k=10, 20 tokens, greedy); outputs must be identical.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from benchmarks import speed
from benchmarks.synthetic import bpe_tokenizer, rag_parts, wordpiece_tokenizer
from rag_demo.generation import decoding
from rag_demo.config import GeneratorConfig
from rag_demo.retrieval.corpus import Passage
from rag_demo.retrieval.encoders import encoder_from_modules
from rag_demo.retrieval.flat import Share, search_placed, search_tensor
from rag_demo.generation.generator import Seq2SeqGenerator
from rag_demo.marginalize import doc_logprobs


@dataclass(frozen=True)
class GpuSizes:
    index_rows: int = 21_000_000
    dim: int = 768
    batches: tuple[int, ...] = (1, 32)
    k: int = 10
    new_tokens: int = 20
    copy_bytes: int = 4 << 30
    repeats: int = 20
    questions: int = 10
    shape: str = "large"  # DPRConfig() + BartConfig()
    passage_words: int = 100
    chunk_rows: int = 1 << 22


TINY = GpuSizes(index_rows=50_000, dim=24, k=3, new_tokens=5, copy_bytes=1 << 20, repeats=3, questions=2, shape="tiny",
                passage_words=30, chunk_rows=1 << 14)

WORDS = ("river city king war music film team song league island church party court museum bridge village novel "
         "station school army ship queen battle album series award season country county region company railway "
         "the of and in to was is for on by with as at from that his her their which first after new").split()


def synthetic_passages(n: int, words: int, *, seed: int) -> list[Passage]:
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(WORDS), (n, words + 2), generator=generator).tolist()
    return [Passage(" ".join(WORDS[i] for i in row[:2]).title(), " ".join(WORDS[i] for i in row[2:])) for row in picks]


def _timed(device: torch.device, fn, repeats: int) -> list[float]:
    """Milliseconds of `fn()` per repeat (after one warm-up), synchronized on CUDA."""
    fn()
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.append((time.perf_counter() - started) * 1000)
    return out


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int) -> dict:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = statistics.median(_timed(device, lambda: dst.copy_(src), repeats))
    return {"bytes_copied": nbytes, "median_ms": ms, "GB_per_s": 2 * nbytes / (ms / 1000) / 1e9}  # read + write


def random_index(rows: int, dim: int, device: torch.device, *, seed: int = 0, chunk: int = 1 << 21) -> torch.Tensor:
    """(rows, dim) fp16 unit-norm random vectors, made chunk by chunk on the device."""
    generator = torch.Generator(device=device).manual_seed(seed)
    xb = torch.empty(rows, dim, dtype=torch.float16, device=device)
    for start in range(0, rows, chunk):
        block = torch.randn(min(chunk, rows - start), dim, device=device, generator=generator)
        xb[start : start + block.shape[0]] = torch.nn.functional.normalize(block, dim=-1).half()
    return xb


def exact_search(xb: torch.Tensor, sizes: GpuSizes, bandwidth: float, device: torch.device) -> list[dict]:
    index_bytes = xb.numel() * xb.element_size()
    floor_ms = index_bytes / (bandwidth * 1e9) * 1000
    placed = (Share(0, xb),)
    rows = []
    for batch in sizes.batches:
        xq = torch.randn(batch, xb.shape[1], device=device).half()
        xq_host = xq.float().cpu().numpy()
        searches = {"fp16 scan": lambda: search_tensor(xq, xb, sizes.k, chunk_rows=sizes.chunk_rows),
                    "engine flat (scan + fp32 re-score)": lambda: search_placed(xq_host, placed, sizes.k, chunk_rows=sizes.chunk_rows)}
        for variant, search in searches.items():
            ms = statistics.median(_timed(device, search, sizes.repeats))
            rows.append({"batch": batch, "variant": variant, "index": f"{xb.shape[0]:,} x {xb.shape[1]} fp16",
                         "index_GB": index_bytes / 1e9, "median_ms": ms, "floor_ms": floor_ms, "ratio_to_floor": ms / floor_ms})
    # the chunked search returns what one matmul over everything returns
    xq = torch.randn(2, xb.shape[1], device=device).half()
    rows_checked = min(xb.shape[0], 1 << 20)
    whole = (xq @ xb[:rows_checked].T).topk(sizes.k, dim=1)
    chunked = search_tensor(xq, xb[:rows_checked], sizes.k, chunk_rows=max(1, rows_checked // 5))
    if not torch.allclose(whole.values.float(), chunked[0].float(), atol=1e-2):
        raise AssertionError("chunked exact search differs from one matmul + top-k")
    # and the engine's re-scored search is the float32 ranking of the stored rows
    exact = (xq.float() @ xb[:rows_checked].float().T).topk(sizes.k, dim=1)
    scores, ids = search_placed(xq.float().cpu().numpy(), (Share(0, xb[:rows_checked]),), sizes.k)
    if ids.tolist() != exact.indices.cpu().tolist() or not torch.allclose(torch.from_numpy(scores), exact.values.cpu(), atol=1e-4):
        raise AssertionError("the engine's flat search differs from a float32 matmul + top-k")
    return rows


def full_question(xb: torch.Tensor, sizes: GpuSizes, device: torch.device, folder: Path) -> list[dict]:
    """Encode -> search -> RAG-Token greedy, per question, with fp16 weights of the paper's shapes."""
    passages = synthetic_passages(256, sizes.passage_words, seed=1)
    texts = [p.title + " " + p.text for p in passages]
    gen_tok = bpe_tokenizer(texts, folder / "bart", 50265 if sizes.shape != "tiny" else 300)
    q_tok = wordpiece_tokenizer(texts, folder / "dpr", 30522 if sizes.shape != "tiny" else 300)
    q_enc, bart = rag_parts(sizes.shape, len(gen_tok), q_tok.vocab_size)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    q_enc, bart = q_enc.to(device, dtype), bart.to(device, dtype)
    encoder = encoder_from_modules("dpr-question-encoder", q_enc, q_tok, kind="dpr")
    generator = Seq2SeqGenerator(bart, gen_tok, GeneratorConfig(model="bart", max_combined_length=300), name="bart")
    dim = q_enc.config.projection_dim or q_enc.config.hidden_size
    if dim != xb.shape[1]:
        raise ValueError(f"question encoder makes {dim}-dim vectors but the index is {xb.shape[1]}-dim")
    questions = [" ".join(p.text.split()[:8]) + "?" for p in synthetic_passages(sizes.questions + 1, 12, seed=2)]
    prefix = generator.generation_prefix()
    rows = []
    for i, question in enumerate(questions):
        stages = {}
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        sync()
        started = time.perf_counter()
        xq = encoder.encode_questions([question])  # (1, D)
        sync()
        stages["encode_ms"] = (time.perf_counter() - started) * 1000
        mark = time.perf_counter()
        scores, ids = search_placed(xq.float().cpu().numpy(), (Share(0, xb),), sizes.k, chunk_rows=sizes.chunk_rows)
        scores, ids = torch.from_numpy(scores), torch.from_numpy(ids)
        sync()
        stages["search_ms"] = (time.perf_counter() - mark) * 1000
        mark = time.perf_counter()
        found = [passages[int(j) % len(passages)] for j in ids[0].tolist()]
        inputs = [generator.format_input(question, p) for p in found]
        doc_lp = doc_logprobs(scores)[0]
        with torch.inference_mode():
            state = generator.start(inputs, prefix)
            hyp = decoding.greedy(generator, state, groups=1, doc_lp=doc_lp, prefix=prefix, max_new_tokens=sizes.new_tokens,
                                  stop_ids=frozenset())[0]  # never stops early: always new_tokens steps
        sync()
        stages["generate_ms"] = (time.perf_counter() - mark) * 1000
        stages["total_ms"] = (time.perf_counter() - started) * 1000
        stages["tokens"] = len(hyp.ids)
        if i > 0:  # the first question warms up
            rows.append(stages)
    summary = {key: statistics.median(r[key] for r in rows) for key in ("encode_ms", "search_ms", "generate_ms", "total_ms")}
    return [{"question": f"DPR-{sizes.shape} encode, search {xb.shape[0]:,}, BART-{sizes.shape} RAG-Token greedy",
             "k": sizes.k, "new_tokens": rows[0]["tokens"], "dtype": str(dtype).removeprefix("torch."), **summary}]


def vs_transformers(sizes: GpuSizes, device: torch.device, mismatches: list[str]) -> list[dict]:
    speed_sizes = replace(speed.Sizes(), hf_shape=sizes.shape, hf_k=sizes.k, hf_new_tokens=sizes.new_tokens,
                          hf_questions=sizes.questions, hf_passages=max(200, sizes.k))
    passages = synthetic_passages(speed_sizes.hf_passages, sizes.passage_words, seed=3)
    questions = [" ".join(p.text.split()[:8]) + "?" for p in synthetic_passages(sizes.questions, 12, seed=4)]
    rows = speed.vs_transformers(speed_sizes, questions, passages, device, mismatches)
    return [row for row in rows if row["variant"].startswith("RAG-Token")]


COLUMNS = {
    "copy": ["bytes_copied", "median_ms", "GB_per_s"],
    "search": ["batch", "variant", "index", "index_GB", "median_ms", "floor_ms", "ratio_to_floor"],
    "question": ["question", "k", "new_tokens", "dtype", "encode_ms", "search_ms", "generate_ms", "total_ms"],
    "vs_transformers": ["variant", "model", "k", "new_tokens", "identical", "ours_ms", "transformers_ms", "ours/theirs"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="toy sizes (runs on a CPU in seconds)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--index-rows", type=int, help="vectors in the exact index (default 21,000,000)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA GPU is visible; use --device cpu (with --tiny)")
    sizes = TINY if args.tiny else GpuSizes()
    if args.index_rows:
        sizes = replace(sizes, index_rows=args.index_rows)
    report: dict = {"machine": speed.machine(), "sizes": asdict(sizes), "mismatches": []}
    print(f"machine: {json.dumps(report['machine'])}", flush=True)

    def section(name, rows):
        report[name] = rows
        print(f"\n## {name}\n\n{speed.table(rows, COLUMNS[name])}", flush=True)

    section("copy", [copy_bandwidth(device, sizes.copy_bytes, sizes.repeats)])
    xb = random_index(sizes.index_rows, sizes.dim, device)
    section("search", exact_search(xb, sizes, report["copy"][0]["GB_per_s"], device))
    with tempfile.TemporaryDirectory() as tmp:
        section("question", full_question(xb, sizes, device, Path(tmp)))
    del xb
    if device.type == "cuda":
        torch.cuda.empty_cache()
        report["peak_gpu_GB"] = torch.cuda.max_memory_allocated(device) / 1e9
    section("vs_transformers", vs_transformers(sizes, device, report["mismatches"]))
    return speed.finish(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
