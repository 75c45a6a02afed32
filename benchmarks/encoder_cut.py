"""How the default KBs' passage cut moves retrieval: the gold passage's rank under each cut.

    python -m benchmarks.encoder_cut --cuts 256,128

For each cut (word pieces of a passage the encoder reads), the default KBs embedded at that cut
and the question encoder fine-tuned against them, built into the cache where missing (minutes a
cut), then every held-out nq-wiki question ranked against nq-wiki under the build's hybrid logits,
with the packaged question encoder and with the one fine-tuned for that cut. Prints one table,
and how close each cut's passage vectors are to the first cut's.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.speed import table
from rag_demo.config import DEFAULT_LEXICAL_WEIGHT, EncoderConfig
from rag_demo.retrieval.corpus import load_kb
from rag_demo.retrieval.encoders import Encoder, load_encoder
from rag_demo.retrieval.lexical import LexicalIndex
from rag_demo.offline.kbs import ensure_nq_kbs
from rag_demo.offline.tuned import ensure_tuned_encoder, training_split
from rag_demo.questions import load_questions
from rag_demo.training import question_encoder as tuner

KS = (1, 5, 20)
RECALL = "gold passage in top 1 / 5 / 20, %"
COSINE = "cosine to the first cut's passage vectors, mean"


def held_out_recall(side: Encoder, vectors: torch.Tensor, lexical: LexicalIndex, questions: list) -> str:
    """"top 1 / 5 / 20" percentages of `questions` whose gold passage `side`'s question model ranks there."""
    found = tuner.recall_at(side.question_model, side, vectors, lexical, questions, lexical_weight=DEFAULT_LEXICAL_WEIGHT, ks=KS)
    return " / ".join(f"{100 * found[k]:.1f}" for k in KS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.encoder_cut", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuts", default="256,128", help="comma-separated word-piece cuts; the first is the reference")
    args = parser.parse_args(argv)
    try:
        cuts = [int(part) for part in args.cuts.split(",") if part.strip()]
    except ValueError:
        raise SystemExit("--cuts takes whole numbers, comma-separated") from None
    if not cuts or min(cuts) < 8:
        raise SystemExit("--cuts takes at least one cut of 8 word pieces or more")
    rows, reference = [], None
    for cut in cuts:
        config = EncoderConfig(max_length=cut)
        encoder = load_encoder(config)
        wiki = ensure_nq_kbs(encoder)["nq-wiki"]
        tuned = load_encoder(config, question_path=ensure_tuned_encoder(encoder, config, wiki))
        kb = load_kb(wiki)
        vectors = torch.from_numpy(kb.embeddings)  # (N, D) unit rows
        reference = vectors if reference is None else reference
        closeness = (vectors * reference).sum(dim=1)  # (N,) cosine to the first cut's vector of the same passage
        lexical = LexicalIndex.for_passages(kb.titles, kb.texts)
        _, held = training_split(load_questions(wiki))
        questions = [tuner.TrainingQuestion(q.question, q.gold_id) for q in held]
        for name, side in (("packaged", encoder), ("fine-tuned for this cut", tuned)):
            rows.append({"cut (word pieces)": str(cut), "question encoder": name, "held-out questions": str(len(questions)),
                         RECALL: held_out_recall(side, vectors, lexical, questions),
                         COSINE: f"{closeness.mean():.4f} (lowest {closeness.min():.4f})"})
    print()
    print(table(rows, ["cut (word pieces)", "question encoder", "held-out questions", RECALL, COSINE]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
