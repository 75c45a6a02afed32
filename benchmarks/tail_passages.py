"""Whether a lead's short rest is what a question naming its article retrieves first.

    python -m benchmarks.tail_passages
    python -m benchmarks.tail_passages --kb-path wikipedia=DIR    # a base built with another cut

Cut into blocks of 100 words, a lead of 205 words leaves a rest of 5 ("Alexander."), whose vector is little but
its article's title. For each article of the leads whose DPR cut leaves such a rest, the question a visitor would
type about it, "who was <title>?" for a person and "what is <title>?" otherwise (the title without a parenthesis,
lower-cased), is asked of the base with the page's retriever (Dense + BM25, flat). Rows group the articles by the
length of that rest; the columns count the questions whose first passage is of the article at all, is its last
passage, and holds fewer than 10 words. Every such article is asked, so the figures do not depend on a draw.
"""

from __future__ import annotations

import argparse
import json
import logging

from rag_demo.config import GENERAL_KB
from rag_demo.evaluate import wilson_interval

REST_GROUPS = ((1, 9), (10, 19), (20, 49), (50, 99))
SHORT_PASSAGE_WORDS = 10


def article_question(article: dict) -> str:
    """The question a visitor would type about an article.

    >>> article_question({"title": "Mercury (planet)", "topic": "Physical sciences"})
    'what is mercury?'
    >>> article_question({"title": "Cleopatra", "topic": "People"})
    'who was cleopatra?'
    """
    asks = "who was" if article.get("topic") == "People" else "what is"
    return f"{asks} {article['title'].split(' (')[0].strip().lower()}?"


def dpr_rest(words: int, *, block: int = 100) -> int:
    """The words left after a lead's last full block of DPR's cut (0 when none is left, or the lead is one block).

    >>> dpr_rest(205), dpr_rest(200), dpr_rest(80)
    (5, 0, 0)
    """
    return words % block if words > block else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kb-path", action="append", default=[], metavar="NAME=PATH",
                        help="ask a base saved elsewhere under NAME (as `eval --kb-path`)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from rag_demo.offline.leads import ensure_leads
    from rag_demo.serving.loading import engine_from_config

    engine = engine_from_config(kb_paths=dict(item.split("=", 1) for item in args.kb_path) or None)
    articles = [a for a in json.loads(ensure_leads().read_text(encoding="utf-8")).values() if a["extract"].strip()]
    print(f"{GENERAL_KB}: {len(engine.resolve_kb(GENERAL_KB).texts):,} passages; \"who was / what is <title>?\" "
          "for each article with a rest, its first passage (Dense + BM25, flat):\n")
    print("| rest of the DPR cut, words | articles | first passage of the article, % | its last passage, % "
          f"| under {SHORT_PASSAGE_WORDS} words, % (95% CI) |")
    print("|---|---|---|---|---|")
    for low, high in REST_GROUPS:
        group = [a for a in articles if low <= dpr_rest(len(a["extract"].split())) <= high]
        own = last = short = 0
        for article in group:
            first = engine.retrieve(article_question(article), kb=GENERAL_KB).passages[0]
            is_own = first.title == article["title"]
            own += is_own
            last += is_own and first.part == first.parts
            short += len(first.text.split()) < SHORT_PASSAGE_WORDS
        n = len(group)
        lo, hi = wilson_interval(short, n)
        print(f"| {low}-{high} | {n} | {100 * own / n:.1f} | {100 * last / n:.1f} | {100 * short / n:.1f} "
              f"({100 * lo:.1f}-{100 * hi:.1f}) |")


if __name__ == "__main__":
    main()
