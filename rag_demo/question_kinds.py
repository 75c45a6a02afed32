"""Kinds of question the knowledge bases cannot answer as asked, or that the sureness bands were not measured on.

A question about the asker or the present, about a recent year, a request for writing, two questions in one, one in
another language, a matter of opinion, a yes/no question, or one asking who or what a thing is by its name alone:
each is a kind of `QUESTION_KINDS`, told by cheap patterns over its words. `sureness` gives no badge to a question of
any of them, and the engine passes on the notice a kind carries (`read_question`).

Importing this module loads nothing heavy.
"""

from __future__ import annotations

import datetime
import re

from .text import clean_text


# Words nearly every English question holds, and those of the languages visitors most often try instead.
# A word both languages use ("a", "was", "die", "hat", "in") is in neither list: it tells nothing.
ENGLISH_WORDS = frozenset(
    "the of and to is are was were who whom whose what which when where why how did does do has have had "
    "by for on with from at as that this these those it its his her their first many much an or name "
    "wrote invented painted discovered won built called largest capital".split())
OTHER_WORDS = frozenset(
    "le la les un une des du de et est qui que quel quelle où qu dans sur pour avec par au aux "  # French
    "der das den dem ein eine einer und ist wer wie wo welche welcher hat von mit auf für "  # German
    "el los las una es quién quien qué cuál cuándo dónde del por para con y fue "  # Spanish
    "il lo gli di che chi è nel della dello sono "  # Italian
    "het een wie wat waar van zijn werd "  # Dutch
    "o os uma um quem onde do da dos das foi "  # Portuguese
    .split()) - ENGLISH_WORDS
NOT_ENGLISH_LETTERS = 0.25  # a question whose letters are this share non-ASCII or more is no English one
LANGUAGE_NOTE = ("This question does not look English. The default models read English: an answer to another "
                 "language is often confidently wrong. Try it in English.")


def looks_english(question: str) -> bool:
    """A cheap guess whether a question is English: its letters mostly ASCII, and its function words English
    rather than French, German, Spanish, Italian, Dutch or Portuguese. Unsure (a name, a few words): True.

    >>> looks_english("who painted the mona lisa?"), looks_english("qui a peint la Joconde ?")
    (True, False)
    >>> looks_english("Wer hat die Mona Lisa gemalt?"), looks_english("誰がモナリザを描いたのか"), looks_english("who sang la vie en rose?")
    (False, False, True)
    >>> looks_english("¿Quién escribió Don Quijote?")
    False
    """
    if "¿" in question or "¡" in question:  # Spanish opens its questions and exclamations with these
        return False
    letters = [ch for ch in question if ch.isalpha()]
    if not letters:
        return True
    if sum(not ch.isascii() for ch in letters) / len(letters) >= NOT_ENGLISH_LETTERS:
        return False
    words = set(re.findall(r"[^\W\d_]+", question.lower()))
    english, other = len(words & ENGLISH_WORDS), len(words & OTHER_WORDS)
    return not (other >= 2 and other > 2 * english)


# Questions whose answer is in no encyclopedia: about the one asking ("what did I eat?", "where are my keys?") or
# about the present day. "I" and "my" count only after a word that makes them the asker's own past or state ("did
# I", "am I", "is my"), since titles and quotations hold them too ("who directed my neighbor totoro?", "world war
# i"), and advice is asked with them of anyone ("how long should I boil an egg?", "how do I tie a tie?"); nor does
# the impersonal "you" ("what do you call ...") ask anything of anyone.
_ABOUT_THE_ASKER = re.compile(
    r"\b(?:am|did|have|had|was|were)\s+i\b"
    r"|\b(?:is|are|was|were|do|does|did|of|for|in|at|to|from|with)\s+my\b|\bmyself\b", re.IGNORECASE)
_ABOUT_NOW = re.compile(
    r"\b(?:today|tonight|tomorrow|yesterday|right now|nowadays|currently|at the moment|this (?:week|weekend|month|year)"
    r"|the latest|the current(?!\s+(?:in|of|through|flowing|flows|that|which|is|was|and|at)\b))\b", re.IGNORECASE)
ABOUT_THE_ASKER_NOTE = ("This question asks about you: no passage here can know that, and neither can the generator. "
                        "The answers say what the passages and the generator make likely, not anything about you.")
ABOUT_NOW_NOTE = ("This question asks about the present: the passages are Wikipedia's text as it stood when it was "
                  "collected, and the generator knows what it read in training. An answer may be out of date.")


# Where the question names a year from here on, few of the base's leads tell it and the generator read little of it;
# the everyday sets, on which the sureness bands were measured, name none after 2016
RECENT_YEARS_FROM = 2020
RECENT_YEAR_NOTE = ("This question is about a recent year: few of the passages tell the events of a single recent year, "
                    "and what the generator read in training may end before it. An answer may be missing or out of date.")
# Asking for writing, not for a fact ("write a poem about cats", "tell me a joke"): a passage holds no answer to it
_REQUEST = re.compile(r"^\s*(?:please\s+)?(?:(?:write|compose|draw|sing|translate|summari[sz]e|generate|create|make up)"
                      r"\s+(?:me|us|a|an|some|another|the|my|this|that|about)|tell\s+(?:me|us)\s+(?:a|an|some|another))\b",
                      re.IGNORECASE)
REQUEST_NOTE = ("This asks for writing rather than a fact: RAG answers questions from passages, and what it writes "
                "here is what the generator makes likely after them.")
# Two questions joined ("who invented the light bulb and when did he die?"): one short answer answers one of them. The
# second asks as a question does, its question word followed by a verb or "many", "long"...; a title joined by "or" or
# "and" seldom does ("twelfth night, or what you will", "dr strangelove or how i learned to stop worrying")
_TWO_QUESTIONS = re.compile(r"\w.*\b(?:and|or)\s+(?:who|whom|whose|when|where|what|which|why|how)\s+"
                            r"(?:is|are|was|were|did|does|do|can|could|will|would|has|have|had|should|many|much|long|old"
                            r"|far|big|tall)\b", re.IGNORECASE)
TWO_QUESTIONS_NOTE = ("This asks two things at once: RAG writes one short answer, which answers one of them at most. "
                      "Ask them one at a time.")
# Questions answered yes or no ("can penguins fly?"): the everyday sets hold none, so their answers get no badge. One
# that asks with a question word further on is trivia that opens with a name ("will smith starred in which film?")
_YES_NO = re.compile(r"^\s*(?:is|are|was|were|am|do|does|did|can|could|will|would|should|shall|has|have|had|may|might"
                     r"|must|isn't|aren't|wasn't|weren't|doesn't|don't|didn't|can't|won't)\b", re.IGNORECASE)
_QUESTION_WORD = re.compile(r"\b(?:who|whom|whose|what|which|when|where|why|how)\b", re.IGNORECASE)
# Asking for a judgement ("is pizza better than pasta?", "what do you think of jazz?", "what is your favourite film?"):
# the passages state facts and the generator has no view, so any answer is what its reading makes likely. A comparison
# asked with a question word is trivia ("which metal conducts better than copper?"); one asked yes or no is a judgement
_OPINION = re.compile(r"^\s*(?:is|are|was|were)\b.*\b(?:better|worse|nicer|cooler|prettier|tastier)\s+than\b"
                      r"|\bwhich\s+is\s+(?:better|worse|nicer)\b"
                      r"|\bdo\s+you\s+(?:think|like|love|hate|prefer|believe|feel|recommend)\b|\byour\s+(?:favou?rite|opinion)\b"
                      r"|\bwhat\s+do\s+you\s+make\s+of\b|\b(?:is|are)\s+(?:\w+\s+){1,4}worth\s+it\b", re.IGNORECASE)
OPINION_NOTE = ("This asks for a judgement: the passages state facts and the generator holds no views, so an answer here "
                "is what it makes likely after reading them, not an opinion anyone gave.")
# Asking who or what a thing is by its name alone ("who was cleopatra?", "what is a black hole?", "who was joan of
# arc?"): the answer wanted describes it, and a short one names it again ("Cleopatra VII") or names a neighbour. The
# everyday sets hold none: each of theirs asks a relation ("who was plato's teacher?", "what is the capital of
# canada?", "what is tofu made from?"), and so does a question whose article a visitor dropped ("what is largest ocean?")
_WHO_OR_WHAT_IS = re.compile(r"^\s*(?:(?:who|what)\s+(?:is|was|are|were)|(?:who|what)(?:'s|’s)|whats|whos)\s+"
                             r"(?:(?P<article>a|an|the)\s+)?(?P<name>[^\W\d][^?!.]*?)\s*[?!.]*\s*$", re.IGNORECASE)
_NOT_A_NAME = frozenset(
    "this that these those it he she they there here i you we your my his her their our its "  # asks of something named before
    "in on at for from to by with about called made named known used like now today current currently "  # a relation
    "most least best worst first second third last only main "  # which one of many (and any "...est": a superlative)
    "capital population height length area size speed name meaning currency language author founder leader head "
    "symbol formula colour color price cost age weight depth distance temperature number value unit definition "
    "president king queen pope chancellor mayor governor ceo emperor".split())  # a property or a role of another
ABOUT_A_NAME_NOTE = ("This asks who or what something is: the passage about it answers that best. A short answer often "
                     "only names it again, or names something beside it, so read the first passage.")


def asks_what_a_name_is(question: str) -> bool:
    """Whether a question asks who or what something is, by its name of up to five words alone.

    >>> [asks_what_a_name_is(q) for q in ("who was cleopatra?", "What is a black hole?", "who was joan of arc?",
    ...                                    "what was the renaissance?", "whats a black hole?", "who was queen victoria?")]
    [True, True, True, True, True, True]
    >>> [asks_what_a_name_is(q) for q in ("who is president?", "who was plato's teacher?", "what is tofu made from?",
    ...                                    "who is the greek god of the sea?", "what is largest ocean?", "what is 7 times 8?")]
    [False, False, False, False, False, False]
    """
    match = _WHO_OR_WHAT_IS.match(question)
    if not match:
        return False
    words = match["name"].lower().replace("’", "'").split()
    if (match["article"] or "").lower() == "the" and (len(words) > 2 or "of" in words):  # "the god of the sea"
        return False  # a name with "the" is short ("the beatles", "the eiffel tower"); a longer one asks a relation
    if not match["article"] and words[0] in ("queen", "king") and len(words) > 1:  # a monarch ("queen victoria")
        words = words[1:]
    return (len(words) <= 5 and not _NOT_A_NAME.intersection(words) and not any("'" in w for w in words)
            and not any(len(w) > 5 and w.endswith("est") for w in words))  # a superlative: "hardest", "shallowest"


def names_a_recent_year(question: str, *, this_year: int | None = None) -> bool:
    """Whether a question names a year from RECENT_YEARS_FROM to `this_year` (today's by default). A later number is
    more often a title than a question about the future ("blade runner 2049", "the game 2048").

    >>> names_a_recent_year("who won the 2025 nba finals?", this_year=2026), names_a_recent_year("who won the 2010 world cup?")
    (True, False)
    >>> names_a_recent_year("who directed blade runner 2049?", this_year=2026), names_a_recent_year("what did the 2,025 runners win?")
    (False, False)
    """
    last = this_year or datetime.date.today().year
    return any(RECENT_YEARS_FROM <= int(year) <= last for year in re.findall(r"(?<![\d,.])(20\d\d)(?![\d,])", question))


# (what the no-badge notice calls it, whether a question is of it, the notice it gets or ''): the kinds of question
# no knowledge base here answers as asked, or that the sureness bands were not measured on (`sureness`)
QUESTION_KINDS = (
    ("a question about you", lambda q: bool(_ABOUT_THE_ASKER.search(q)), ABOUT_THE_ASKER_NOTE),
    ("a question about the present", lambda q: bool(_ABOUT_NOW.search(q)), ABOUT_NOW_NOTE),
    ("a question about a recent year", names_a_recent_year, RECENT_YEAR_NOTE),
    ("a request for writing", lambda q: bool(_REQUEST.search(q)), REQUEST_NOTE),
    ("two questions in one", lambda q: bool(_TWO_QUESTIONS.search(q)), TWO_QUESTIONS_NOTE),
    ("a question not in English", lambda q: not looks_english(q), LANGUAGE_NOTE),
    ("a question of opinion", lambda q: bool(_OPINION.search(q)), OPINION_NOTE),
    ("a yes/no question", lambda q: bool(_YES_NO.search(q)) and not _QUESTION_WORD.search(q), ""),
    ("a question of who or what something is", asks_what_a_name_is, ABOUT_A_NAME_NOTE),
)


def unusual_kinds(question: str) -> tuple[str, ...]:
    """The QUESTION_KINDS a question is of, by name; () for a question of fact such as the everyday sets hold.

    >>> unusual_kinds("what did I eat for breakfast?"), unusual_kinds("who is president today?")
    (('a question about you',), ('a question about the present',))
    >>> unusual_kinds("can penguins fly?"), unusual_kinds("write a poem about cats"), unusual_kinds("tell me a joke")
    (('a yes/no question',), ('a request for writing',), ('a request for writing',))
    >>> unusual_kinds("who directed my neighbor totoro?"), unusual_kinds("whose assassination sparked world war i?")
    ((), ())
    >>> unusual_kinds("how long should I boil an egg?"), unusual_kinds("how do I tie a tie?")
    ((), ())
    >>> unusual_kinds("what do you call a baby frog?"), unusual_kinds("what is the SI unit of electric current?")
    ((), ())
    >>> unusual_kinds("what is the current in a circuit measured in?"), unusual_kinds("who is the current pope?")
    ((), ('a question about the present',))
    >>> unusual_kinds("who wrote the book 'is it over'?"), unusual_kinds("who sang tell me why?")
    ((), ())
    >>> unusual_kinds("who invented the light bulb and when did he die?"), unusual_kinds("who wrote who's afraid of virginia woolf?")
    (('two questions in one',), ())
    >>> unusual_kinds("who wrote twelfth night, or what you will?"), unusual_kinds("will smith starred in which film?")
    ((), ())
    >>> unusual_kinds("singer of bohemian rhapsody?"), unusual_kinds("drawbridge is a type of what?")
    ((), ())
    >>> unusual_kinds("Is pizza better than pasta?"), unusual_kinds("what is your favourite film?")
    (('a question of opinion', 'a yes/no question'), ('a question of opinion',))
    >>> unusual_kinds("which metal conducts better than copper?"), unusual_kinds("who sang better than ever?")
    ((), ())
    """
    return tuple(name for name, applies, _ in QUESTION_KINDS if applies(question))


def question_notices(question: str) -> tuple[str, ...]:
    """The notices a question's kinds carry (`QUESTION_KINDS`): about the asker, the present, a recent year, a request
    for writing, two questions in one, another language; () for a question of fact."""
    return tuple(note for _, applies, note in QUESTION_KINDS if note and applies(question))


def read_question(question: str) -> tuple[str, tuple[str, ...]]:
    """A question as the engine reads it (`text.clean_text`, its end kept), and the notices a reader should see,
    `question_notices`' among them."""
    question, notices = clean_text(question, what="question", keep_end=True)
    return question, notices + question_notices(question)
