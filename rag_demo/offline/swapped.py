"""A counterfactual twin of the wikipedia KB: the same passages, row for row, with people's names permuted.

The NQ pair gets its false world from BIG-bench's swapped answers (`worlds`); the leads of the vital
articles come with none, so one is made here. Every person whose article title is a plain personal
name takes another person's name, everywhere in the base: Vincent van Gogh's lead becomes the article
of, say, "Claude Monet", and every passage that mentioned Van Gogh now mentions Monet. A model that
answers "Claude Monet" to "who painted The Starry Night?" read it from the index; one that answers
"Van Gogh" remembered it. People are paired within an occupation (painters with painters), so the
false world stays plausible and a model cannot tell it is false from the text alone.

Pure functions, no I/O.
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ..retrieval.corpus import Passage
from .worlds import WholeWords

# Lower-case words that may stand inside a name, before the surname ("Vincent van Gogh", "Charles de
# Gaulle"); they join the surname ("van Gogh"). Any other lower-case word ("of", "the", "ibn", "and")
# marks a title or an epithet, not a plain personal name.
PARTICLES = frozenset({"van", "von", "de", "da", "di", "del", "della", "der", "den", "des", "du", "la", "le",
                       "ter", "ten", "dos", "das", "do"})
# Capitalized words that make a title a style, a rank or a group rather than a personal name: "Pope Leo I",
# "Kublai Khan" (his article's "Khan" alone is the rank, so swapping it as a surname goes wrong), "The Doors",
# "Marx Brothers", "El Greco". "Pope" and "King" are surnames too ("Alexander Pope", "Stephen King"), so
# they only rule a name out as its first word.
TITLE_WORDS = frozenset({"The", "Saint", "St.", "Sir", "Lord", "Lady", "Dame", "Queen", "Prince", "Princess",
                         "Emperor", "Empress", "Tsar", "Czar", "Sultan", "Shah", "Khan", "Pasha", "Guru", "Mother",
                         "Dr.", "Chanyu", "Brothers", "Sisters", "Family", "Ibn", "Abu", "Jr.", "Sr."})
FIRST_TITLE_WORDS = frozenset({"Pope", "King", "El", "La", "Le"})
_ROMAN = re.compile(r"[IVXLCDM]+")  # regnal numbers: "Johann Strauss II"
GROUP_OCCUPATIONS = frozenset({"band", "group", "duo", "trio", "team"})  # "Pink Floyd": "English rock band"
_LIFE_SPAN = re.compile(r"\((?:born |died |b\. |d\. |c\. ?|fl\. )?\d", re.I)  # "(1853–1890)", "(born 1949)"
_TERM = re.compile(r"\bfrom (?:c\. )?\d+(?: BCE?| AD)? to (?:c\. )?\d")  # "President of ... from 1861 to 1865"
_PERSONAL_PRONOUN = re.compile(r"\b(?:[Hh]e|[Hh]is|him|[Ss]he|[Hh]er)\b")
_SENTENCE_END = re.compile(r"[.!?][\"'”’)\]]*\s*$")
# a place named after a person, then its region: "Stanford, California" (a surname alone before it is left)
_PLACE_AFTER = re.compile(r", [A-Z][a-z]")


@dataclass(frozen=True)
class Person:
    """A candidate for the swap: an article whose title is a plain personal name."""

    name: str  # the article title, "Vincent van Gogh"
    surname: str  # how the lead names them alone: "van Gogh"; "Mao" for family-name-first names
    occupation: str  # "painter"; "" when the description names none


@dataclass(frozen=True)
class SwappedWorld:
    """The counterfactual base and how it was made.

    passages[i] is input row i with the names swapped (len(passages) == len(input)); substitutes maps
    each candidate's real name to the name that replaces it (a derangement of the candidates);
    swapped_rows holds the rows whose title or text changed; surnames maps each candidate's name to
    the surname swapped in their own article (what `counterfactual_answer` matches surname answers to).
    """

    passages: list[Passage]
    substitutes: dict[str, str]
    swapped_rows: frozenset[int]
    surnames: dict[str, str] = field(default_factory=dict)


# --- reading names in text ---------------------------------------------------------------------------

def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _whole_spans(text: str, word: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each occurrence of `word` with no word character just outside it."""
    start = text.find(word)
    while start != -1:
        end = start + len(word)
        if (start == 0 or not _is_word_char(text[start - 1])) and (end == len(text) or not _is_word_char(text[end])):
            yield start, end
        start = text.find(word, end if end > start else start + 1)


def _stands_alone(text: str, start: int, end: int) -> bool:
    """Whether a name at text[start:end] is the whole name there, not part of a longer one: no hyphen
    glued to it ("Oscar-Claude Monet", "Newton-Smith") and no capitalized word right after it
    ("George Washington Carver", "Isaac Newton Institute", "Van Gogh Museum").

    >>> t = "George Washington Carver met George Washington."
    >>> [_stands_alone(t, s, s + 17) for s in (0, 29)]
    [False, True]
    """
    if start > 0 and text[start - 1] == "-":
        return False
    after = text[end:end + 2]
    return not (after[:1] == "-" and after[1:2].isalpha()) and not (after[:1] == " " and after[1:2].isupper())


def _sentence_start(text: str, start: int) -> bool:
    """Whether text[start] begins a sentence (or the passage)."""
    before = text[:start]
    return not before.strip() or bool(_SENTENCE_END.search(before))


# --- who is swapped, and with whom ------------------------------------------------------------------

def is_personal_name(title: str) -> bool:
    """Whether an article title reads as a plain personal name: 2 or 3 words, no parentheses, commas or
    digits; the first and last word capitalized, any word between capitalized or a particle ("van");
    no regnal number ("II") and no title word ("Pope", "Khan", "The").

    >>> [is_personal_name(t) for t in ("Vincent van Gogh", "Arthur C. Clarke", "Alexander the Great",
    ...  "Johann Strauss II", "Hans Krebs (biochemist)", "Plato", "Pope Leo I", "The Doors", "Stephen King")]
    [True, True, False, False, False, False, False, False, True]
    """
    words = title.split()
    if not 2 <= len(words) <= 3 or any(ch in "(),[]" or ch.isdigit() for ch in title):
        return False
    if not (words[0][:1].isupper() and words[-1][:1].isupper()) or words[0] in FIRST_TITLE_WORDS:
        return False
    return all((w[:1].isupper() or w in PARTICLES) and w not in TITLE_WORDS and not _ROMAN.fullmatch(w) for w in words)


def occupation(description: str) -> str:
    """The occupation a Wikidata-style description ends on: its last word before any parenthesis or
    "from ... to ..." span, lower-cased; "" when that word holds a digit or there is none.

    >>> [occupation(d) for d in ("Dutch painter (1853–1890)", "American physicist, Nobel laureate",
    ...                          "President of Chile from 1970 to 1973", "", "born 1940")]
    ['painter', 'laureate', 'chile', '', '']
    """
    head = re.split(r"\(| from ", description, maxsplit=1)[0]
    words = head.split()
    word = words[-1].strip(".,;:'\"").lower() if words else ""
    return "" if any(ch.isdigit() for ch in word) else word


def _surname_of(name: str) -> str:
    """The last word with the particles before it: "Vincent van Gogh" -> "van Gogh"."""
    words = name.split()
    start = len(words) - 1
    while start > 1 and words[start - 1] in PARTICLES:
        start -= 1
    return " ".join(words[start:])


_NOT_BY_NAME_BEFORE = ("of ", "the ", "The ")  # "the state of Han", "the Qin dynasty", "the Soong family"
_NOT_BY_NAME_AFTER = tuple(f" {w} " for w in PARTICLES | {"of", "the"})  # "John of the Mountains", "Carl von Linné"


def _called_by(lead: str, word: str) -> int:
    """How many times `lead` calls someone by `word` alone: whole-word mentions standing alone, not
    inside a longer name ("Carl von Linné", "Glorious John") nor naming a place or a house ("the state
    of Han").

    >>> _called_by("Zhou was born in the Zhou dynasty. The state of Zhou fell. Zhou of Qi, Old Zhou, Zhou.", "Zhou")
    2
    """
    def by_name(start: int, end: int) -> bool:
        before = lead[:start]
        previous = before[:-1].rsplit(" ", 1)[-1].lstrip("\"“‘'(") if before.endswith(" ") else ""
        return (_stands_alone(lead, start, end) and not before.endswith(_NOT_BY_NAME_BEFORE)
                and not lead[end:].startswith(_NOT_BY_NAME_AFTER)
                and not (previous[:1].isupper() and previous[-1:].isalpha()))

    return sum(by_name(start, end) for start, end in _whole_spans(lead, word))


def surname(name: str, lead: str) -> str:
    """The name a person's own lead calls them by alone: the last word with its particles, unless the
    lead calls them by the first word (`_called_by`) more often than it mentions the last word at all,
    both outside the full name, as for names with the family name first ("Zhou Enlai" ... "Zhou was")
    and people known by a given name ("Galileo Galilei" ... "Galileo studied"). Against the last word
    every mention counts, the birth name's too ("Ella Jane Fitzgerald"), so a stray "Lady Ella" or
    "Sam's Club" does not make a first name the surname.

    >>> surname("Vincent van Gogh", "Vincent Willem van Gogh was a Dutch painter. Van Gogh ...")
    'van Gogh'
    >>> surname("Zhou Enlai", "Zhou Enlai was the first premier. Zhou was born in Huai'an.")
    'Zhou'
    >>> surname("Qin Shi Huang", "Qin Shi Huang was the founder of the Qin dynasty. He invented the title.")
    'Huang'
    """
    words = name.split()
    last = _surname_of(name)
    if any(w in PARTICLES for w in words):
        return last
    rest = lead.replace(name, " ")  # mentions inside the full name count for neither
    return words[0] if _called_by(rest, words[0]) > sum(1 for _ in _whole_spans(rest, words[-1])) else last


def is_person(article: Mapping) -> bool:
    """Whether an article is about one person. Topic "People" is, unless its description ends on a
    group ("English rock band"). Many of the most famous people are filed under "Uncategorized"
    (Vincent van Gogh, Isaac Newton, Mao Zedong) beside empires and oceans: there the description must
    give a life span or a term of office and the lead must speak of its subject as he or she, or, for a
    life span, open with the first word of the title ("Sigmund Freud was"; "The Holy Roman Empire was"
    does not). Other topics hold no persons.

    >>> art = lambda topic, description, extract: {"topic": topic, "description": description, "extract": extract,
    ...                                            "title": "Al Bo"}
    >>> [is_person(art("People", "Dutch painter", "")), is_person(art("People", "English rock band", "")),
    ...  is_person(art("Uncategorized", "Dutch painter (1853–1890)", "Al Bo was")),
    ...  is_person(art("Uncategorized", "Turkish Empire (c. 1299–1922)", "The Al Bo was")),
    ...  is_person(art("Uncategorized", "President from 1861 to 1865", "Al Bo was. He led.")),
    ...  is_person(art("Uncategorized", "Civilization from 1200 BC to 600 AD", "Al Bo was"))]
    [True, False, True, False, True, False]
    """
    description, lead = str(article.get("description", "")), str(article.get("extract", ""))
    if article.get("topic") == "People":
        return occupation(description) not in GROUP_OCCUPATIONS
    if article.get("topic") != "Uncategorized":
        return False
    pronoun = _PERSONAL_PRONOUN.search(lead) is not None
    first = str(article.get("title", "")).split()[:1]
    if _LIFE_SPAN.search(description):
        return pronoun or (bool(first) and lead.startswith(first[0]))
    return pronoun and _TERM.search(description) is not None


def people(articles: Mapping[str, Mapping]) -> list[Person]:
    """The swap's candidates: articles about a person (`is_person`) whose title `is_personal_name`, by name.

    >>> people({"a": {"title": "Vincent van Gogh", "extract": "Van Gogh was", "description": "Dutch painter (1853–1890)",
    ...               "topic": "People"}, "b": {"title": "Plato", "extract": "", "description": "", "topic": "People"}})
    [Person(name='Vincent van Gogh', surname='van Gogh', occupation='painter')]
    """
    found: dict[str, Person] = {}
    for article in articles.values():
        title = str(article.get("title", ""))
        if is_personal_name(title) and title not in found and is_person(article):
            found[title] = Person(title, surname(title, str(article.get("extract", ""))),
                                  occupation(str(article.get("description", ""))))
    return [found[name] for name in sorted(found)]


def _derangement(names: Sequence[str], rng: random.Random) -> list[str]:
    """A uniformly random permutation of `names` with no name in its own place (2 or more names).

    Rejection sampling: a random permutation has no fixed point with probability about 1/e, so this
    takes under 3 shuffles on average.
    """
    shuffled = list(names)
    while True:
        rng.shuffle(shuffled)
        if all(a != b for a, b in zip(names, shuffled)):
            return shuffled


def occupation_groups(candidates: Sequence[Person]) -> dict[str, list[str]]:
    """Names by occupation, each group of 2 or more; the rest (groups of one, no occupation) pooled
    under "". A lone pooled name joins the largest group, since one name cannot be deranged.

    >>> p = lambda name, job: Person(name, name.split()[-1], job)
    >>> occupation_groups([p("Al Bo", "painter"), p("Cy Do", "painter"), p("Ed Fu", "poet"), p("Gu Hi", "")])
    {'painter': ['Al Bo', 'Cy Do'], '': ['Ed Fu', 'Gu Hi']}
    """
    by_job: dict[str, list[str]] = defaultdict(list)
    for person in candidates:
        by_job[person.occupation].append(person.name)
    groups = {job: names for job, names in by_job.items() if job and len(names) > 1}
    pool = [name for job, names in by_job.items() if not job or len(names) == 1 for name in names]
    if len(pool) == 1 and groups:
        largest = max(groups, key=lambda job: (len(groups[job]), job))
        groups[largest] = groups[largest] + pool
    elif pool:
        groups[""] = pool
    return {job: sorted(names) for job, names in sorted(groups.items(), key=lambda kv: (kv[0] == "", kv[0]))}


def pair_people(candidates: Sequence[Person], *, seed: int = 0) -> dict[str, str]:
    """real name -> substitute: a seeded derangement within each occupation group (`occupation_groups`).
    Deterministic for a seed, whatever the candidates' order; empty for fewer than 2 candidates.

    >>> p = lambda name: Person(name, name.split()[-1], "painter")
    >>> pair_people([p("Al Bo"), p("Cy Do")])
    {'Al Bo': 'Cy Do', 'Cy Do': 'Al Bo'}
    """
    rng = random.Random(seed)
    substitutes: dict[str, str] = {}
    for names in occupation_groups(sorted(candidates, key=lambda p: p.name)).values():
        if len(names) > 1:
            substitutes.update(zip(names, _derangement(names, rng)))
    return substitutes


# --- replacing names in text -------------------------------------------------------------------------

def _as_mentioned(replacement: str, text: str, start: int) -> str:
    """`replacement` capitalized where the mention begins a sentence ("van Gogh" -> "Van Gogh")."""
    return replacement[:1].upper() + replacement[1:] if _sentence_start(text, start) else replacement


def _surname_forms(person: Person) -> list[str]:
    """The ways a lead names a person by surname alone: "van Gogh", "Van Gogh" and the bare "Gogh"."""
    forms = [person.surname, person.surname[:1].upper() + person.surname[1:], person.surname.split()[-1]]
    return list(dict.fromkeys(forms))


def _birth_name_end(text: str, person: Person) -> int:
    """Where a lead's opening full name ends, when the passage opens with 1 to 7 name words and then
    the surname, as leads open with the birth name ("Vincent Willem van Gogh was", "Sir David
    Frederick Attenborough is"); 0 when it does not.

    >>> _birth_name_end('Heywood "Woody" Allen is an American filmmaker.', Person("Woody Allen", "Allen", ""))
    21
    >>> _birth_name_end("Allen is an American filmmaker.", Person("Woody Allen", "Allen", ""))
    0
    """
    if person.surname != _surname_of(person.name):
        return 0  # family name first ("Zhou Enlai"): the lead opens with the name as titled
    last = person.surname.split()[-1]
    words = text.split(" ")[:8]
    end = 0
    for i, word in enumerate(words):
        core = word.rstrip(",;:.")
        core = core[:-2] if core.endswith(("'s", "’s")) else core
        if core == last and i > 0:
            return end + len(last)
        if not (word[:1].isupper() or word in PARTICLES or (word[:1] in "\"“" and word[1:2].isupper())):
            return 0
        end += len(word) + 1
    return 0


def _spans(text: str, names: WholeWords | None, substitutes: Mapping[str, str], own: Person | None,
           own_substitute: Person | None, opening: bool,
           mentioned: Sequence[tuple[Person, Person]] = ()) -> list[tuple[int, int, str]]:
    """(start, end, replacement) of every name to swap in one passage, left to right, not overlapping.

    Every candidate's full name; in the person's own article (`own`) also their surname alone and,
    in the lead's opening passage, the birth name it opens with; the surname alone of each person the
    article names in full (`mentioned`, with their substitutes). Where spans overlap, the earlier
    wins, and at one start the birth name, then a full name, then a surname: so "Vincent van Gogh"
    is swapped as a whole, never as "Vincent" + the surname's substitute.
    """
    found: list[tuple[int, int, int, str]] = []  # (start, priority, end, replacement)
    if names is not None:
        for start, end in names.spans(text):
            if _stands_alone(text, start, end):
                found.append((start, 1, end, substitutes[text[start:end]]))
    if own is not None and own_substitute is not None:
        if opening and (end := _birth_name_end(text, own)):
            found.append((0, 0, end, own_substitute.name))
        for form in _surname_forms(own):
            for start, end in _whole_spans(text, form):
                if _stands_alone(text, start, end):
                    found.append((start, 2 + (form != own.surname), end, _as_mentioned(own_substitute.surname, text, start)))
    for person, substitute in mentioned:
        for form in _surname_forms(person)[:2]:  # not the bare last word ("Gogh"): elsewhere it may be a word
            for start, end in _whole_spans(text, form):
                if _stands_alone(text, start, end) and not _PLACE_AFTER.match(text, end):
                    found.append((start, 4, end, _as_mentioned(substitute.surname, text, start)))
    found.sort()
    spans, reached = [], 0
    for start, _, end, replacement in found:
        if start >= reached:
            spans.append((start, end, replacement))
            reached = end
    return spans


def _apply(text: str, spans: Iterable[tuple[int, int, str]]) -> str:
    pieces, kept = [], 0
    for start, end, replacement in spans:
        pieces += [text[kept:start], replacement]
        kept = end
    return "".join(pieces) + text[kept:]


def _named_in_full(passages: Sequence[Passage], rows: Sequence[int], names: WholeWords | None,
                   by_name: Mapping[str, Person], substitutes: Mapping[str, str], shared: frozenset[str]) -> list[tuple[Person, Person]]:
    """The candidates one article (its `rows`) names in full, other than its own subject, with their substitutes:
    after "Leo Tolstoy" a lead says "Tolstoy". Left out: a surname several candidates share ("Roosevelt"), which
    may name another of them."""
    if names is None:
        return []
    title = passages[rows[0]].title
    found = {passages[row].text[start:end] for row in rows for start, end in names.spans(passages[row].text)
             if _stands_alone(passages[row].text, start, end)}
    return [(by_name[name], by_name[substitutes[name]]) for name in sorted(found)
            if name != title and by_name[name].surname not in shared]


def _articles(passages: Sequence[Passage]) -> Iterator[list[int]]:
    """Each article's rows: a run of passages with one title."""
    rows: list[int] = []
    for row, passage in enumerate(passages):
        if rows and passage.title != passages[rows[-1]].title:
            yield rows
            rows = []
        rows.append(row)
    if rows:
        yield rows


def swap_people(articles: Mapping[str, Mapping], passages: Sequence[Passage], *, seed: int = 0) -> SwappedWorld:
    """The counterfactual twin of `passages` (`leads.lead_passages(articles)`): every candidate's full
    name (`people`) replaced by their substitute's (`pair_people`) in every title and text, all at once
    (A -> B and B -> C never turn A into C), whole words only, a possessive "'s" kept. In a person's own
    article their surname alone and the birth name the lead opens with are swapped too. In an article that
    names a person in full, their surname alone is theirs as well ("Leo Tolstoy ... Tolstoy himself"), title
    included ("Shakespeare's sonnets"), unless several candidates share it; in other articles a surname alone
    is left, as it may name someone else (a relative, a place).

    Rows are aligned with the input: row i of the twin is row i of `passages`, its names swapped.

    >>> articles = {k: {"title": n, "extract": e, "description": "painter", "topic": "People"} for k, n, e in [
    ...     ("g", "Vincent van Gogh", "Vincent Willem van Gogh was Dutch. Van Gogh's work inspired Claude Monet."),
    ...     ("m", "Claude Monet", "Oscar-Claude Monet was French. Monet admired Vincent van Gogh.")]}
    >>> from rag_demo.offline.leads import lead_passages
    >>> world = swap_people(articles, lead_passages(articles))
    >>> world.substitutes
    {'Claude Monet': 'Vincent van Gogh', 'Vincent van Gogh': 'Claude Monet'}
    >>> [(p.title, p.text) for p in world.passages]  # doctest: +NORMALIZE_WHITESPACE
    [('Vincent van Gogh', 'Vincent van Gogh was French. Van Gogh admired Claude Monet.'),
     ('Claude Monet', "Claude Monet was Dutch. Monet's work inspired Vincent van Gogh.")]
    """
    candidates = people(articles)
    substitutes = pair_people(candidates, seed=seed)
    by_name = {p.name: p for p in candidates}
    names = WholeWords(substitutes) if substitutes else None
    surname_counts = Counter(p.surname for p in candidates if p.name in substitutes)
    shared = frozenset(surname for surname, count in surname_counts.items() if count > 1)
    swapped, rows = [], set()
    for article in _articles(passages):
        mentioned = _named_in_full(passages, article, names, by_name, substitutes, shared)
        for row in article:
            passage = passages[row]
            own = by_name.get(passage.title) if passage.title in substitutes else None
            own_substitute = by_name[substitutes[own.name]] if own is not None else None
            opening = row == article[0]  # the first passage of an article opens its lead
            text = _apply(passage.text, _spans(passage.text, names, substitutes, own, own_substitute, opening, mentioned))
            title = _apply(passage.title, _spans(passage.title, names, substitutes, None, None, False, mentioned))
            if (title, text) != (passage.title, passage.text):
                rows.add(row)
            swapped.append(Passage(title=title, text=text))
    return SwappedWorld(swapped, substitutes, frozenset(rows), {p.name: p.surname for p in candidates if p.name in substitutes})


def counterfactual_answer(text: str, answers: Sequence[str], world: SwappedWorld) -> str:
    """What the counterfactual base answers for a question whose real answers (aliases) are `answers`:
    the substitute of the first alias that is a swapped person's full name or surname, "" when none is.

    `text` is the counterfactual passage the answer is read from (as for `questions.answer_in_text`):
    the substitute is given as it spells it, its full name if it holds that as whole words, else its
    surname if it holds that; when it holds neither, a full-name alias gives the substitute's full name
    and a surname alias ("Van Gogh", "Gogh") the substitute's surname. A surname shared by several
    swapped people ("Roosevelt") names none of them.

    >>> world = SwappedWorld([], {"Vincent van Gogh": "Claude Monet", "Claude Monet": "Vincent van Gogh"}, frozenset(),
    ...                      {"Vincent van Gogh": "van Gogh", "Claude Monet": "Monet"})
    >>> [counterfactual_answer("", a, world) for a in (["Vincent van Gogh"], ["Van Gogh"], ["Paris", "Monet"], ["Paris"])]
    ['Claude Monet', 'Monet', 'van Gogh', '']
    >>> counterfactual_answer("painted by Claude Monet in 1889", ["Van Gogh"], world)
    'Claude Monet'
    """
    by_surname: dict[str, set[str]] = defaultdict(set)
    for name, surname_ in world.surnames.items():
        for form in _surname_forms(Person(name, surname_, "")):
            by_surname[form].add(name)
    for alias in (a.strip() for a in answers):
        if alias in world.substitutes:
            real, full = alias, True
        elif len(by_surname.get(alias, ())) == 1:
            (real,), full = by_surname[alias], False
        else:
            continue
        substitute = world.substitutes[real]
        forms = [substitute, world.surnames.get(substitute, _surname_of(substitute))]
        for form in forms:
            if next(_whole_spans(text, form), None) is not None:
                return form
        return forms[0] if full else forms[1]
    return ""
