"""The question encoder fine-tuned on a share of its training questions: time and retrieval recall.

    python -m benchmarks.encoder_questions --shares 0.5,0.25

For each share, the build's recipe (`TuningConfig`, the default KBs' nq-wiki vectors, the hybrid
logits) on that share of nq-wiki's training questions, drawn in one seeded order so a smaller share
is a part of a larger one; then every held-out nq-wiki question ranked under the hybrid logits.
The packaged question side and the build's own fine-tuned one (`TuningConfig.question_share` of
them, from the cache) are the first rows. Builds the default KBs and question encoder where missing. Prints one
table.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from benchmarks.encoder_cut import RECALL, held_out_recall
from benchmarks.speed import table
from rag_demo.config import DEFAULT_LEXICAL_WEIGHT, EncoderConfig, TuningConfig
from rag_demo.retrieval.corpus import load_kb
from rag_demo.retrieval.encoders import load_encoder
from rag_demo.retrieval.lexical import LexicalIndex
from rag_demo.offline.kbs import ensure_nq_kbs
from rag_demo.offline.tuned import ensure_tuned_encoder, training_split
from rag_demo.questions import load_questions
from rag_demo.training import question_encoder as tuner

COLUMNS = ("question side", "training questions", "fine-tune, s", RECALL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.encoder_questions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shares", default="0.5,0.25", help="comma-separated shares of the training questions, in (0, 1]")
    parser.add_argument("--seed", type=int, default=0, help="the order the shares are drawn in")
    args = parser.parse_args(argv)
    try:
        shares = [float(part) for part in args.shares.split(",") if part.strip()]
    except ValueError:
        raise SystemExit("--shares takes numbers, comma-separated") from None
    if not shares or not all(0 < share <= 1 for share in shares):
        raise SystemExit("--shares takes shares in (0, 1]")
    config, recipe = EncoderConfig(), TuningConfig()
    encoder = load_encoder(config)
    wiki = ensure_nq_kbs(encoder)["nq-wiki"]
    built = load_encoder(config, question_path=ensure_tuned_encoder(encoder, config, wiki))
    kb = load_kb(wiki)
    vectors = torch.from_numpy(kb.embeddings)  # (N, D)
    lexical = LexicalIndex.for_passages(kb.titles, kb.texts)
    training, held = training_split(load_questions(wiki))
    training = [tuner.TrainingQuestion(q.question, q.gold_id) for q in training]
    check = [tuner.TrainingQuestion(q.question, q.gold_id) for q in held]
    rows = [("packaged", "0", "-", held_out_recall(encoder, vectors, lexical, check)),
            ("the build's (cached)", f"{len(tuner.drawn_share(training, recipe.question_share, seed=recipe.seed)):,}", "-", held_out_recall(built, vectors, lexical, check))]
    for share in shares:
        part = tuner.drawn_share(training, share, seed=args.seed)
        started = time.perf_counter()
        model = tuner.tune_question_encoder(encoder, kb.embeddings, lexical, part, lexical_weight=DEFAULT_LEXICAL_WEIGHT,
                                            config=recipe, autocast=True)
        rows.append((f"{share:g} of the training questions", f"{len(part):,}", f"{time.perf_counter() - started:.1f}",
                     held_out_recall(replace(encoder, question_model=model), vectors, lexical, check)))
    print(f"\nheld-out nq-wiki questions: {len(check):,}; threads {torch.get_num_threads()}\n")
    print(table([dict(zip(COLUMNS, row)) for row in rows], list(COLUMNS)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
