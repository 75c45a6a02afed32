"""An answer's numbers as files a visitor downloads: the JSON `/ask_json` returns, and each posterior
heatmap as CSV. Pure functions over results and a folder; no gradio.

The CSV holds what its heatmap draws: one row per source (the passages by rank, then ∅ memory when
it is a source), p(z|x), then the posterior at each answer token, one column per token.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
from pathlib import Path

from .. import plots
from ..results import AskResult, VariantResult

JSON_NAME = "rag-answer.json"
CSV_NAMES = {"token": "rag-token-posterior.csv", "sequence": "rag-sequence-posterior.csv"}


def posterior_csv(variant: VariantResult, result: AskResult) -> str:
    """The heatmap of `variant` as CSV text: header `source, title, p(z|x), 1:<token>, 2:<token>, ...`.

    Token columns are numbered, since an answer may repeat a token; probabilities carry 6 decimals.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    tokens = [f"{i}:{plots.token_label(t)}" for i, t in enumerate(variant.tokens, start=1)]
    writer.writerow(["source", "title", "p(z|x)", *tokens])
    columns = list(zip(*plots.source_posteriors(variant)))  # (K or K + 1, T)
    for j, passage in enumerate(result.passages):
        row = columns[j] if j < len(columns) else ()
        writer.writerow([f"#{passage.rank}", passage.title, f"{passage.prob:.6f}", *(f"{p:.6f}" for p in row)])
    if variant.memory_posteriors and result.memory_prob is not None:
        writer.writerow([plots.MEMORY_NAME, plots.MEMORY_WHAT, f"{result.memory_prob:.6f}",
                         *(f"{p:.6f}" for p in variant.memory_posteriors)])
    return out.getvalue()


def write_exports(result: AskResult, folder: Path) -> dict[str, Path]:
    """Write the answer's JSON and one CSV per variant under `folder`; {"json" | variant name: path}.

    Each answer gets a subfolder named by its content, so a file name never stands for two answers
    (gradio caches served files by path), and the last answer's subfolder is removed: a visitor
    downloads the answer the page shows."""
    text = json.dumps(result.to_json(), ensure_ascii=False, indent=1)
    answer_folder = folder / hashlib.sha256(text.encode()).hexdigest()[:12]
    if folder.is_dir():
        for old in folder.iterdir():
            if old != answer_folder:
                shutil.rmtree(old, ignore_errors=True)
    answer_folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths = {"json": answer_folder / JSON_NAME}
    paths["json"].write_text(text, encoding="utf-8")
    for name, variant in result.variants.items():
        path = answer_folder / CSV_NAMES.get(name, f"rag-{name}-posterior.csv")
        path.write_text(posterior_csv(variant, result), encoding="utf-8")
        paths[name] = path
    return paths
