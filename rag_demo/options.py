"""The choices an ask may make, parsed and checked once: the RAG variants, index kinds and decodings.

The page, the JSON API, the command line, `eval` and the engine all call these, so what one of them
accepts the others accept, and what one refuses the others refuse with the same message.
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import DECODINGS, INDEX_KINDS, VARIANTS
from .errors import InputError

BOTH = "both"  # the page's and the CLI's word for every variant
CLOSED_BOOK = "closed-book"  # `eval`'s name for the generator alone, beside the variants


def parse_variants(choice: str | Sequence[str], *, closed_book: bool = False) -> tuple[str, ...]:
    """"token" | "sequence" | "both", or a sequence of variants -> the variants, in the order given.

    `closed_book` also admits CLOSED_BOOK as a variant (what `eval` scores beside the two).

    >>> parse_variants("both"), parse_variants(["sequence"])
    (('token', 'sequence'), ('sequence',))
    >>> parse_variants("closed-book", closed_book=True)
    ('closed-book',)
    """
    allowed = (*VARIANTS, CLOSED_BOOK) if closed_book else VARIANTS
    words = ", ".join(allowed[:-1]) + f" or {allowed[-1]}" + ("" if closed_book else f" or {BOTH}")
    if isinstance(choice, str):
        variants = VARIANTS if choice == BOTH and not closed_book else (choice,)
    elif isinstance(choice, Sequence):
        variants = tuple(choice)
    else:
        raise InputError(f"unknown variant {str(choice)[:40]!r}; choose {words}")
    unknown = [v for v in variants if v not in allowed]
    if unknown or not variants:
        shown = str(unknown[0])[:40] if unknown else ""
        raise InputError(f"unknown variant {shown!r}; choose {words}")
    return variants


def check_index(kind: str) -> str:
    """An index kind the engine offers, or an InputError that lists them.

    >>> check_index("hnsw")
    'hnsw'
    """
    if kind not in INDEX_KINDS:
        raise InputError(f"unknown index {str(kind)[:40]!r}; choose one of {', '.join(INDEX_KINDS)}")
    return kind


def check_decoding(decoding: str) -> str:
    """A RAG-Sequence decoding (paper, section 2.5), or an InputError that names both."""
    if decoding not in DECODINGS:
        raise InputError(f"unknown decoding {str(decoding)[:40]!r}; choose {' or '.join(DECODINGS)}")
    return decoding
