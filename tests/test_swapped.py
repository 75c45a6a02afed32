"""The counterfactual twin of the wikipedia KB (`offline.swapped`): a permutation of people's names,
on tiny synthetic leads in the real file's format, and once on the real file where it is present."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rag_demo.offline.cache import resolve_root
from rag_demo.offline.leads import LEADS_SOURCE, lead_passages
from rag_demo.offline.swapped import (SwappedWorld, counterfactual_answer, is_personal_name, pair_people, people,
                                      swap_people)

# the leads as the offline default caches them (`leads.ensure_leads`), where a first start has fetched them
REAL_LEADS = resolve_root(None) / "sources" / f"{LEADS_SOURCE.package}-{LEADS_SOURCE.version}" / Path(LEADS_SOURCE.member).name


def article(title: str, extract: str, description: str = "English physicist (1642–1727)", topic: str = "People") -> dict:
    return {"title": title, "extract": extract, "description": description, "topic": topic}


def leads(*articles: dict) -> dict[str, dict]:
    return {a["title"]: a for a in articles}


def two_physicists(extra: str = "") -> dict[str, dict]:
    """Isaac Newton and Albert Einstein, the only candidates: each one's substitute is the other."""
    return leads(
        article("Isaac Newton", "Sir Isaac Newton was an English polymath. Newton's Principia founded "
                                "Newtonian mechanics. Newton died in 1727."),
        article("Albert Einstein", "Albert Einstein was a German-born physicist. Einstein read Isaac Newton."),
        article("Classical mechanics", "Classical mechanics, or Newtonian mechanics, goes back to Isaac Newton's "
                                       "Principia. Newton and Albert Einstein both shaped physics." + extra,
                description="Branch of physics", topic="Physical sciences"),
    )


def world_of(articles: dict[str, dict], *, seed: int = 0) -> tuple[list, SwappedWorld]:
    passages = lead_passages(articles)
    return passages, swap_people(articles, passages, seed=seed)


def text_of(world: SwappedWorld, passages: list, title: str) -> str:
    """The swapped text of the article that was titled `title` (one passage)."""
    (row,) = [i for i, p in enumerate(passages) if p.title == title]
    return world.passages[row].text


def many_people() -> dict[str, dict]:
    """Painters, poets and people with a job no one else has (pooled together)."""
    jobs = {"painter": ["Ann Arlo", "Ben Brand", "Cara Cole", "Dan Dorn", "Eve Earl"],
            "poet": ["Fay Ford", "Gil Gray", "Hal Hope"],
            "": ["Ivy Irons"]}
    loners = {"Jon Judd": "American chemist", "Kim Kent": "Welsh explorer (1801–1850)", "Lee Lund": "astronaut"}
    articles = [article(n, f"{n} was a {job or 'writer'}.", f"Dutch {job} (1853–1890)" if job else "")
                for job, names in jobs.items() for n in names]
    articles += [article(n, f"{n} was notable.", d) for n, d in loners.items()]
    return leads(*articles)


@pytest.mark.parametrize("title, expected", [
    ("Vincent van Gogh", True), ("Arthur C. Clarke", True), ("Jean-Paul Sartre", True), ("Marie Curie", True),
    ("Alexander the Great", False), ("Johann Strauss II", False), ("Hans Krebs (biochemist)", False),
    ("Plato", False), ("Martin Luther King Jr.", False), ("Pope Leo I", False), ("Kublai Khan", False),
    ("The Doors", False), ("Ibn Battuta", False), ("Stephen King", True), ("Alexander Pope", True),
])
def test_plain_personal_names(title, expected):
    assert is_personal_name(title) is expected


def test_candidates_are_people_with_plain_names():
    articles = leads(
        article("Isaac Newton", "Newton was."),
        article("Alexander the Great", "He was."),
        article("Pink Floyd", "They were.", description="English rock band"),
        article("Vincent van Gogh", "Vincent Willem van Gogh was a painter. He", "Dutch painter (1853–1890)",
                topic="Uncategorized"),  # the most famous people are filed here
        article("Ottoman Empire", "The Ottoman Empire was.", "Turkish Empire (c. 1299–1922)", topic="Uncategorized"),
        article("Hoover Dam", "Hoover Dam is.", "Dam in Nevada", topic="Technology"),
    )
    assert [p.name for p in people(articles)] == ["Isaac Newton", "Vincent van Gogh"]


@pytest.mark.parametrize("seed", range(12))
def test_a_derangement_within_occupations(seed):
    found = people(many_people())
    substitutes = pair_people(found, seed=seed)
    names = sorted(p.name for p in found)
    assert sorted(substitutes) == names and sorted(substitutes.values()) == names  # each once as key and as value
    assert all(real != substitute for real, substitute in substitutes.items())
    job = {p.name: p.occupation for p in found}
    for real, substitute in substitutes.items():
        if job[real] in ("painter", "poet"):
            assert job[substitute] == job[real]  # painters take painters' names
        else:  # the pool: no occupation, or one no one else has
            assert job[substitute] not in ("painter", "poet")


def test_a_lone_pooled_name_joins_the_largest_group():
    found = people(leads(*[article(n, f"{n} was.", "Dutch painter") for n in ("Al Bo", "Cy Do", "Ed Fu")],
                         article("Gu Hi", "Gu Hi was.", "Welsh explorer")))
    for seed in range(6):
        substitutes = pair_people(found, seed=seed)
        assert sorted(substitutes) == ["Al Bo", "Cy Do", "Ed Fu", "Gu Hi"]
        assert all(real != substitute for real, substitute in substitutes.items())


def test_deterministic_for_a_seed_and_another_world_for_another():
    articles = many_people()
    _, first = world_of(articles, seed=3)
    _, again = world_of(dict(reversed(list(articles.items()))), seed=3)  # the file's order does not matter
    assert first.substitutes == again.substitutes and first.passages == again.passages
    assert any(world_of(articles, seed=seed)[1].substitutes != first.substitutes for seed in range(4, 8))


def test_simultaneous_replacement_swaps_both_names():
    passages, world = world_of(two_physicists())
    assert world.substitutes == {"Isaac Newton": "Albert Einstein", "Albert Einstein": "Isaac Newton"}
    text = text_of(world, passages, "Classical mechanics")
    # A -> B and B -> A at once: neither name ends up as the other's substitute twice
    assert "Albert Einstein's Principia" in text and "Einstein and Isaac Newton both shaped" in text


def test_whole_words_only_and_possessives_kept():
    passages, world = world_of(two_physicists(" Isaac Newtonson and Isaac Newton-Smith were not Newton."))
    text = text_of(world, passages, "Classical mechanics")
    assert "Newtonian mechanics" in text
    assert "Isaac Newtonson" in text and "Isaac Newton-Smith" in text  # longer words and names are left
    assert "Albert Einstein's Principia" in text  # the possessive stays with the new name
    own = text_of(world, passages, "Isaac Newton")
    assert "Einstein's Principia founded Newtonian mechanics" in own


def test_surname_alone_in_the_own_article_and_where_the_full_name_is_named():
    passages, world = world_of(two_physicists())
    newton = text_of(world, passages, "Isaac Newton")
    assert newton == ("Albert Einstein was an English polymath. Einstein's Principia founded Newtonian mechanics. "
                      "Einstein died in 1727.")  # "Sir Isaac Newton", the lead's opening name, swapped whole
    assert text_of(world, passages, "Albert Einstein") == "Isaac Newton was a German-born physicist. Newton read Albert Einstein."
    # an article that names Isaac Newton in full means him by "Newton" too
    assert "Einstein and Isaac Newton both shaped" in text_of(world, passages, "Classical mechanics")
    # one that does not may mean someone else: "Newton" stays, and so do the titles that hold it
    others = {**two_physicists(), **leads(
        article("Newton's cradle", "Newton's cradle shows conservation of momentum.", "Toy", topic="Physical sciences"),
        article("Newton's laws of motion", "Isaac Newton stated three laws. Newton's first law is inertia.",
                "Physics", topic="Physical sciences"))}
    passages, world = world_of(others)
    titles = [p.title for p in world.passages]
    assert "Newton's cradle" in titles and text_of(world, passages, "Newton's cradle").startswith("Newton's cradle shows")
    assert "Einstein's laws of motion" in titles  # its lead names Isaac Newton: the title follows
    laws = world.passages[[p.title for p in passages].index("Newton's laws of motion")]
    assert laws.text == "Albert Einstein stated three laws. Einstein's first law is inertia."


def test_a_surname_before_a_region_is_a_place_and_stays():
    articles = {**two_physicists(), **leads(article(
        "Newton University", "Newton University is in Newton, Massachusetts. Isaac Newton inspired it; Newton's "
        "laws are taught there.", "University", topic="Education"))}
    passages, world = world_of(articles)
    assert text_of(world, passages, "Newton University") == (
        "Newton University is in Newton, Massachusetts. Albert Einstein inspired it; Einstein's laws are taught there.")


def test_a_surname_several_people_share_is_left_where_it_is_not_their_own_article():
    articles = {**two_physicists(), **leads(
        article("Franklin D. Roosevelt", "Franklin D. Roosevelt was president. Roosevelt won four times."),
        article("Theodore Roosevelt", "Theodore Roosevelt was president. Roosevelt led the Rough Riders."),
        article("New Deal", "The New Deal of Franklin D. Roosevelt. Roosevelt signed it.", "Programs",
                topic="History"))}
    passages, world = world_of(articles)
    assert world.substitutes["Franklin D. Roosevelt"] in text_of(world, passages, "New Deal")  # the full name is swapped
    assert text_of(world, passages, "New Deal").endswith("Roosevelt signed it.")  # which Roosevelt: not told


def test_rows_aligned_and_titles_swapped():
    passages, world = world_of(two_physicists())
    assert len(world.passages) == len(passages)
    assert [p.title for p in passages] == ["Albert Einstein", "Classical mechanics", "Isaac Newton"]
    assert [p.title for p in world.passages] == ["Isaac Newton", "Classical mechanics", "Albert Einstein"]
    assert world.swapped_rows == frozenset({0, 1, 2})
    unchanged = leads(*two_physicists().values(), article("Moon", "The Moon orbits.", "Satellite", topic="Geography"))
    passages, world = world_of(unchanged)
    moon = [p.title for p in passages].index("Moon")
    assert moon not in world.swapped_rows and world.passages[moon] == passages[moon]


def test_long_leads_keep_their_rows():
    long_lead = " ".join(["Newton studied light."] * 60)  # 180 words: two passages of 100 and 80
    articles = leads(*two_physicists().values())
    articles["Isaac Newton"] = article("Isaac Newton", long_lead)
    passages, world = world_of(articles)
    rows = [i for i, p in enumerate(passages) if p.title == "Isaac Newton"]
    assert len(rows) == 2 and all(world.passages[i].title == "Albert Einstein" for i in rows)
    assert all("Newton" not in world.passages[i].text and len(world.passages[i].text.split()) == len(passages[i].text.split())
               for i in rows)


def test_fewer_than_two_candidates_swap_nothing():
    articles = leads(article("Isaac Newton", "Newton was."), article("Moon", "Isaac Newton saw it.", topic="Geography"))
    passages, world = world_of(articles)
    assert world.substitutes == {} and world.swapped_rows == frozenset() and world.passages == passages


def test_counterfactual_answer():
    passages, world = world_of(two_physicists())
    newton_row = text_of(world, passages, "Isaac Newton")  # now says "Albert Einstein" / "Einstein"
    assert counterfactual_answer("", ["Isaac Newton", "Newton"], world) == "Albert Einstein"
    assert counterfactual_answer("", ["Sir Isaac", "Newton"], world) == "Einstein"
    assert counterfactual_answer(newton_row, ["Newton"], world) == "Albert Einstein"  # as the passage spells it
    assert counterfactual_answer(newton_row, ["1727", "London"], world) == ""
    assert counterfactual_answer("", ["Newtonian mechanics"], world) == ""


@pytest.mark.skipif(not REAL_LEADS.exists(), reason=f"the real leads are not at {REAL_LEADS}")
def test_on_the_real_leads():
    articles = json.loads(REAL_LEADS.read_text(encoding="utf-8"))
    passages = lead_passages(articles)
    start = time.perf_counter()
    world = swap_people(articles, passages)
    took = time.perf_counter() - start
    assert len(world.substitutes) >= 800 and took < 10
    assert sorted(world.substitutes.values()) == sorted(world.substitutes)
    assert all(real != substitute for real, substitute in world.substitutes.items())
    assert len(world.passages) == len(passages) and len(world.swapped_rows) > len(world.substitutes)
    gogh = [i for i, p in enumerate(passages) if p.title == "Vincent van Gogh"]
    assert gogh and all(world.passages[i].title == world.substitutes["Vincent van Gogh"] for i in gogh)
    assert "Vincent van Gogh" not in world.passages[gogh[0]].text
    # an article that names William Shakespeare in full means him by "Shakespeare" too, in its title as well
    for title in ("Shakespeare's sonnets", "A Midsummer Night's Dream", "Hamlet"):
        rows = [i for i, p in enumerate(passages) if p.title == title]
        assert rows and all("Shakespeare" not in world.passages[i].title + world.passages[i].text for i in rows), title
