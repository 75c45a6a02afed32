"""How far choosing among RAG-Sequence's candidate answers could take exact match.

    python -m benchmarks.candidate_ceiling --questions everyday-train --n 150 --seed 0

RAG-Sequence decodes one answer per source (each of the k passages, and the generator's memory where
it is a source) and keeps the one with the highest marginal p(y|x). Any rule that picks among those
candidates differently (a reranker, a vote, a product with the memory's likelihood) can at best pick a
right one where one exists. Each question is asked as the page asks it (both variants, closed-book,
the default base and options); the table gives each answer's exact match, the share with a right
candidate (the ceiling for any such rule), and the share with an answer in the passages read.
"""

from __future__ import annotations

from benchmarks.evidence_kinds import asked_as_the_page, page_asks_arguments
from rag_demo.evaluate import matches_any, wilson_interval
from rag_demo.questions import answer_in_text

ROWS = (
    ("token", "RAG-Token's answer"),
    ("sequence", "RAG-Sequence's answer"),
    ("closed", "closed-book's answer"),
    ("candidate", "some RAG-Sequence candidate (the ceiling of choosing among them)"),
    ("either", "some candidate, or RAG-Token's answer"),
    ("passages", "an answer in the passages read (k = 5)"),
)


def tally_question(result, answers) -> dict[str, bool]:
    """For one asked question: which of ROWS holds a right answer."""
    right = {
        "token": matches_any(result.variants["token"].answer, answers),
        "sequence": matches_any(result.variants["sequence"].answer, answers),
        "closed": result.closed_book is not None and matches_any(result.closed_book.answer, answers),
        "candidate": any(matches_any(text, answers) for text, _ in result.variants["sequence"].candidates),
        "passages": any(answer_in_text(f"{p.title} {p.text}", answers) for p in result.passages),
    }
    right["either"] = right["candidate"] or right["token"]
    return right


def main(argv: list[str] | None = None) -> None:
    args = page_asks_arguments(__doc__.split("\n\n")[0], argv)
    counts = dict.fromkeys((key for key, _ in ROWS), 0)
    candidates = n = 0
    for item, result in asked_as_the_page(args):
        n += 1
        candidates += len(result.variants["sequence"].candidates)
        for key, right in tally_question(result, item.answers).items():
            counts[key] += right

    print(f"{args.kb}, {args.questions}: {n} questions (seed {args.seed}), {candidates / n:.1f} RAG-Sequence candidates "
          "a question\n")
    print("| right | exact match, % (95% CI) |\n|---|---|")
    for key, words in ROWS:
        low, high = wilson_interval(counts[key], n)
        print(f"| {words} | {100 * counts[key] / n:.1f} ({100 * low:.1f}-{100 * high:.1f}) |")


if __name__ == "__main__":
    main()
