"""Retrieving with the generator's closed-book answer added to the question (generation-augmented retrieval):
does the general base find more answer-bearing passages, and does RAG-Token answer more questions?

    python -m benchmarks.query_expansion --questions everyday-train
    python -m benchmarks.query_expansion --questions everyday-train --end-to-end 150 --seed 0

The closed-book answer is the engine's (`RagEngine.closed_book`). Retrieval is scored as in
`benchmarks.general_retrieval` (the first passage holding an alias as whole words); each expanded query
is ranked under the engine's hybrid logits `scale · cos + β · BM25`. With `--end-to-end N`, N questions
drawn as `eval` draws them are asked twice with RAG-Token at k = 5 and the page's defaults: once as the
page asks, once reading the top 5 of the expanded query (`ask(rows=...)`), whose p(z|x) stays the
softmax of the question's own logits over those rows, so only which passages are read changes.
"""

from __future__ import annotations

import numpy as np
import torch

from rag_demo.config import ASK
from rag_demo.evaluate import matches_any, sample_questions, wilson_interval
from rag_demo.questions import answer_in_text, normalize_answer

from .general_retrieval import KS, covering_rows, first_hits, load_question_set_run, question_set_parser


def hybrid_logits(engine, knowledge, texts: list[str]) -> torch.Tensor:
    """(Q, N) hybrid retrieval logits of `texts` over every passage of `knowledge`."""
    encoder = engine.encoder
    passages = torch.as_tensor(np.ascontiguousarray(knowledge.embeddings, dtype=np.float32))  # (N, D)
    vectors = torch.cat([encoder.encode_questions(texts[i:i + 64]).float().cpu() for i in range(0, len(texts), 64)])
    bm25 = engine.retriever.lexical_index(knowledge)
    lexical = torch.from_numpy(np.stack([bm25.scores(t) for t in texts]).astype(np.float32))  # (Q, N)
    return encoder.scale * vectors @ passages.T + engine.lexical_weight * lexical


def percent(hits: int, n: int) -> str:
    low, high = wilson_interval(hits, n)
    return f"{100 * hits / n:.1f} ({100 * low:.1f}-{100 * high:.1f})"


def main(argv: list[str] | None = None) -> None:
    parser = question_set_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--end-to-end", type=int, default=0, metavar="N", help="also ask N questions both ways")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    engine, knowledge, questions = load_question_set_run(args)
    closed = {q.question: engine.closed_book(q.question).answer for q in questions}
    n = len(questions)
    print(f"{args.kb}: {len(knowledge):,} passages; {args.questions}: {n} questions; the closed-book answer "
          f"holds an alias for {percent(sum(bool(answer_in_text(closed[q.question], q.answers)) for q in questions), n)}%\n")

    texts = list(knowledge.texts)
    normalized = [f" {normalize_answer(t)} " for t in texts]
    covering = [set(covering_rows(texts, normalized, q.answers)) for q in questions]
    queries = {
        "the question (the default)": [q.question for q in questions],
        "the question and its closed-book answer": [f"{q.question} {closed[q.question]}" for q in questions],
    }
    print("| query | " + " | ".join(f"@{k}" for k in KS) + " |")
    print("|---|" + "---|" * len(KS))
    found = {}
    for name, texts_asked in queries.items():
        ranks = first_hits(hybrid_logits(engine, knowledge, texts_asked), covering, max(KS))
        found[name] = [r is not None and r < ASK.k for r in ranks]
        print(f"| {name} | " + " | ".join(f"{100 * sum(r is not None and r < k for r in ranks) / n:.1f}" for k in KS) + " |")
    remembered = [bool(answer_in_text(closed[q.question], q.answers)) for q in questions]
    print(f"\nAn answer in the top {ASK.k}, by whether the closed-book answer holds an alias "
          f"({sum(remembered)} do, {n - sum(remembered)} do not):")
    for name, hits in found.items():
        print(f"  {name}: {sum(h for h, r in zip(hits, remembered) if r)} and "
              f"{sum(h for h, r in zip(hits, remembered) if not r)}")

    if not args.end_to_end:
        return
    picked = sample_questions(questions, args.end_to_end, args.seed)
    expanded = hybrid_logits(engine, knowledge, [f"{q.question} {closed[q.question]}" for q in picked])
    right = {"as the page asks": 0, "reading the expanded query's top 5": 0}
    changed = []
    for q, logits in zip(picked, expanded):
        answers = []
        for name, rows in zip(right, (None, logits.topk(ASK.k).indices.tolist())):
            answer = engine.ask(q.question, kb=args.kb, variants=("token",), closed_book=False, rows=rows).variants["token"].answer
            right[name] += matches_any(answer, q.answers)
            answers.append(answer)
        if answers[0] != answers[1]:
            changed.append(f"{q.question}: {answers[0]!r} -> {answers[1]!r} (closed-book {closed[q.question]!r})")
    m = len(picked)
    print(f"\nRAG-Token, k = {ASK.k}, {m} questions (seed {args.seed}), exact match, % (95% CI)\n")
    print("| passages read | exact match |\n|---|---|")
    for name, hits in right.items():
        print(f"| {name} | {percent(hits, m)} |")
    print(f"\n{len(changed)} answers changed:")
    for line in changed:
        print(" ", line)


if __name__ == "__main__":
    main()
