"""benchmarks/scale.py at toy size, its child steps run in this process (the real run starts one per configuration)."""

from __future__ import annotations

from collections import Counter

import pytest


@pytest.fixture(scope="module")
def scale():
    from benchmarks import scale

    return scale


def test_sizes_and_parameters(scale):
    assert [scale.parse_size(s) for s in ("10k", "1m", "2500", "0.5M")] == [10_000, 1_000_000, 2500, 500_000]
    config = scale.index_config(1_000_000, "ivfpq")
    assert (config.ivf_nlist, config.pq_bytes, config.ivf_rerank) == (1024, 48, 100)
    assert scale.index_config(10_000, "ivfpq").ivf_nlist == 256 and scale.index_config(10, "hnsw").ivf_rerank == 0
    assert scale.index_config(5_000_000, "ivfpq").ivf_nlist == 4096


def test_toy_run_of_every_step(scale, tmp_path):
    plan = scale.Plan(dim=16, queries=5, block=700, per_topic=50, language=50_000)
    kb = scale.ensure_kb(tmp_path / "kb", 2000, plan)
    queries = scale.ensure_queries(tmp_path / "q.npy", 2000, plan)
    rows = []
    for kind, rerank in (("flat", 0), ("hnsw", 0), ("ivfpq", 0), ("ivfpq", 100)):
        spec = {"kb": str(kb), "kind": kind, "queries": str(queries), "exact": str(tmp_path / "exact.npy"), "rerank": rerank}
        rows.append({"n": 2000, "kind": kind, "label": scale.label(2000, kind, rerank=rerank), **scale.child_build(spec),
                     **scale.child_serve(spec)})
    assert rows[0]["recall_at_10"] == 1.0 and rows[0]["bytes"] == 2000 * 16 * 2 and rows[0]["build_s"] is None
    assert rows[1]["recall_at_10"] >= 0.9 and rows[2]["bytes"] > 0
    assert rows[3]["recall_at_10"] >= rows[2]["recall_at_10"] and "rerank 100" in rows[3]["label"]
    assert all(r["ms_per_question"] > 0 and r["VmHWM"] >= r["VmRSS"] > 0 for r in rows)
    text = scale.table(rows + [{"n": 5_000_000, "kind": "hnsw", "skipped": "not built"}])
    assert text.count("\n") == 6 and "| 2,000 | flat (fp16 memmap, chunks) | — | 64,000 |" in text and "not built" in text


def test_a_child_runs_as_its_own_process(scale, tmp_path):
    """The real run starts each step as `python -m benchmarks.scale --child`, from the repository root."""
    plan = scale.Plan(dim=16, queries=3, block=500, per_topic=50)
    spec = {"kb": str(scale.ensure_kb(tmp_path / "kb", 500, plan)), "kind": "flat", "rerank": 0,
            "queries": str(scale.ensure_queries(tmp_path / "q.npy", 500, plan)), "exact": str(tmp_path / "exact.npy")}
    served = scale.run_child("serve", spec, timeout=300)
    assert served["recall_at_10"] == 1.0 and served["shown"] == 10


def test_synthetic_texts_are_zipf_and_stable(scale):
    assert [scale.spelled(r) for r in (0, 1, 25, 26, 650)] == ["ba", "bb", "bz", "ca", "baa"]
    texts = scale.synthetic_texts(12_000, seed=3, words=50, language=50_000)
    assert len(texts) == 12_000 and all(len(t.split()) == 50 for t in texts[::1000])
    assert scale.synthetic_texts(10_001, seed=3, words=50, language=50_000)[10_000] == texts[10_000]  # whatever n
    counts = sorted(Counter(" ".join(texts[:2000]).split()).values(), reverse=True)
    assert counts[0] > 20 * counts[100] and counts[-1] == 1  # a few words everywhere, many once


def test_toy_run_of_bm25(scale, tmp_path):
    plan = scale.Plan(dim=16, queries=5, block=700, per_topic=50, words=30, language=50_000)
    kb = scale.ensure_kb(tmp_path / "kb", 2000, plan)
    assert not (kb / "bm25").exists()  # built and timed by the build child, not with the KB
    spec = {"kb": str(kb), "kind": "bm25", "queries": 5, "question_words": 6}
    row = {"n": 2000, "kind": "bm25", **scale.child_build_bm25(spec), **scale.child_serve_bm25(spec)}
    assert row["postings"] > 2000 * 10 and row["terms"] > 1000 and row["bytes"] > row["postings"] * 8
    assert row["source_at_10"] >= 0.8 and row["ms_per_question"] > 0 and row["open_ms"] > 0 and row["dict_mb"] >= 0
    text = scale.bm25_table([row])
    assert text.count("\n") == 2 and f"| 2,000 | {row['terms']:,} | {row['postings']:,} |" in text


def test_extrapolation_to_the_papers_scale(scale, tmp_path, capsys):
    import json

    rows = [{"n": 1_000_000, "dim": 384, "kind": "flat", "label": "flat (fp16 memmap, chunks)", "ms_per_question": 500.0,
             "RssAnon": 300.0, "bytes": 768_000_000},
            {"n": 100_000, "dim": 384, "kind": "flat", "label": "flat (fp16 memmap, chunks)", "ms_per_question": 50.0,
             "RssAnon": 250.0, "bytes": 76_800_000},
            {"n": 1_000_000, "dim": 384, "kind": "hnsw", "label": "hnsw", "bytes": 1_808_000_000, "ms_per_question": 0.2,
             "RssAnon": 228.0},
            {"n": 1_000_000, "dim": 384, "kind": "ivfpq", "label": "ivfpq", "pq_bytes": 48, "bytes": 58_000_000,
             "ms_per_question": 2.0, "RssAnon": 217.0},
            {"n": 1_000_000, "dim": 384, "kind": "bm25", "bytes": 694_000_000, "ms_per_question": 14.0, "RssAnon": 151.0},
            {"n": 5_000_000, "kind": "hnsw", "skipped": "not built"}]
    out = {r["index"]: r for r in scale.extrapolate(rows)}
    flat = out["flat (fp16 memmap, chunks)"]
    assert flat["from_n"] == 1_000_000 and flat["bytes"] == 21_000_000 * 768 * 2
    assert flat["ms_per_question"] == pytest.approx(500 * 21 * 2)  # N x D
    assert out["hnsw"]["bytes"] == pytest.approx(21_000_000 * (768 * 4 + 1808 - 384 * 4), rel=1e-6)
    assert out["ivfpq"]["bytes"] == 21_000_000 * (96 + 8) and out["ivfpq"]["ms_per_question"] == pytest.approx(4.0)
    assert out["bm25"]["ms_per_question"] == pytest.approx(14.0 * 21)
    assert [r["ms_per_question"] for r in out.values() if "H200" in r["index"]] == [8.0, 13.7]
    measured = {"build_s": 1.0, "build_peak_mb": 1.0, "build_anon_peak_mb": 1.0, "VmRSS": 1.0, "VmHWM": 1.0,
                "recall_at_10": 1.0, "terms": 1, "postings": 1, "vocabulary_bytes": 1, "dict_mb": 1.0, "open_ms": 1.0,
                "source_at_10": 1.0}  # the other columns of the tables
    saved = tmp_path / "rows.json"
    saved.write_text(json.dumps({"rows": [r if r.get("skipped") else {**measured, **r} for r in rows]}))
    assert scale.main(["--from-json", str(saved)]) == 0
    printed = capsys.readouterr().out
    assert "Extrapolated to 21,000,000 x 768" in printed and "| hnsw | not built |" in printed
