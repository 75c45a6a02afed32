"""What the page says about an answer in words: plain-text sentences, no HTML and no gradio (html.py
escapes them where it shows them).

Where memory stands among the sources, where an answer's words are (a passage, memory, or nothing shown),
where RAG-Token and RAG-Sequence disagree and where their posteriors switch passage, what an index swap showed, and where the generator's memory outweighed the
passages (a knowledge conflict).
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import plots
from ..config import GENERAL_KB, LIKELY_RIGHT_P, LIKELY_WRONG_P
from ..evaluate import exact_match
from ..progress import counted, listed
from ..questions import holds_answer
from ..results import AskResult, RetrievedPassage, VariantResult
from ..sureness import long_answer


_SUPERSCRIPTS = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def fmt_prob(p: float) -> str:
    """A probability for people: 3 decimals; powers of ten, as a blackboard writes them, when tiny.

    >>> fmt_prob(0.73456), fmt_prob(0.0000123), fmt_prob(4.2e-120), fmt_prob(0.0)
    ('0.735', '1.23 × 10⁻⁵', '4.20 × 10⁻¹²⁰', '0')
    """
    if p == 0:
        return "0"
    if abs(p) >= 0.001:
        return f"{p:.3f}"
    mantissa, exponent = f"{p:.2e}".split("e")
    return f"{mantissa} × 10{str(int(exponent)).translate(_SUPERSCRIPTS)}"


def memory_sentence(result: AskResult) -> str:
    """What p(∅|x) says, in words (plain text); "" when memory is not a source of this answer."""
    if result.memory_prob is None:
        return ""
    k = counted(len(result.passages), "passage")
    if plots.memory_leads(result):
        than = "more than the passage" if len(result.passages) == 1 else f"more than any of the {k}"
        return (f"∅ memory is the largest source: p(∅|x) = {fmt_prob(result.memory_prob)}, {than}. "
                "No passage matches this question as well as the generator's own memory does" + _how_answers_lean(result))
    return f"∅ memory is a source beside the {k}: p(∅|x) = {fmt_prob(result.memory_prob)}."


def _how_answers_lean(result: AskResult) -> str:
    """The end of memory_sentence: whether the answers' tokens, once read, lean on memory or on the passages
    (`_memory_share` over one half), since a large p(∅|x) is what retrieval said, before any token."""
    named = {plots.VARIANT_NAMES[v.variant]: share for v in result.variants.values()
             if (share := _memory_share(v)) is not None}
    shares = list(named.values())
    if shares and all(share > 0.5 for share in shares):
        return ", and the answer leans on what the model remembers."
    if shares and all(share <= 0.5 for share in shares):
        each = (f"{shares[0]:.2f}" if len(named) == 1
                else ", ".join(f"{name} {share:.2f}" for name, share in named.items()))
        return f"; even so, the answer's tokens lean on the passages (∅ memory's posterior {each})."
    return "; the two answers lean on it differently (see each answer's tokens)." if shares else "."


LINE_BREAK_NOTE = ("↵ is a line break the generator wrote. At the end of an answer (often “↵↵”, a blank line) it is "
                   "how the generator stops: the stop is a token too, and its probability is part of p(y|x).")
SCORED_LINE_BREAK_NOTE = ("↵ ends the answer you typed: scoring adds the line break with which the generator stops, "
                          "and its probability is part of p(y|x), as for an answer the generator writes.")
SPACE_TOKEN_NOTE = ("␣ is a token that is a space alone: the generator's tokenizer writes a number as a space and "
                    "then one token per digit (“␣ 1 9 8 9”), and each is scored like any other token.")


def _switches_in_words(variant: VariantResult, passages: Sequence[RetrievedPassage]) -> str:
    """Where a variant's leading source changes, in words: 'from passage #1 to passage #3 at “Kem”'."""
    return "; ".join(
        f"from {plots.source_name(before, passages)} to {plots.source_name(after, passages)} at "
        f"“{plots.token_label(variant.tokens[t])}” (token {t + 1})"
        for t, before, after in plots.source_switches(variant))


def variants_disagree(result: AskResult) -> bool:
    """Whether RAG-Token and RAG-Sequence gave different answers (after SQuAD normalization)."""
    token, sequence = result.variants.get("token"), result.variants.get("sequence")
    return token is not None and sequence is not None and not exact_match(token.answer, sequence.answer)


def disagreement_sentence(result: AskResult) -> str:
    """When the two variants answer differently: both answers and, for each, where its posterior switches
    source (plain text); "" when they agree or only one was asked."""
    if not variants_disagree(result):
        return ""
    sentences = [f"RAG-Token and RAG-Sequence disagree: RAG-Token says “{result.variants['token'].answer}”, "
                 f"RAG-Sequence “{result.variants['sequence'].answer}”."]
    token, sequence = result.variants["token"], result.variants["sequence"]
    leaders = [plots.leading_sources(v) for v in (token, sequence)]
    if leaders[0] and leaders[1] and len(set(leaders[0]) | set(leaders[1])) == 1:
        # one passage leads both answers throughout: "stays on #1" twice would leave the difference unexplained
        sentences.append(f"Both posteriors stay on {plots.source_name(leaders[0][0], result.passages)} for every token; "
                         "the answers still differ because the other sources keep a share: RAG-Token mixes every "
                         "source's next-token probabilities at each step, RAG-Sequence scores each whole answer "
                         "against every source.")
        return " ".join(sentences)
    for variant in (token, sequence):
        name = plots.VARIANT_NAMES[variant.variant]
        leaders = plots.leading_sources(variant)
        switches = _switches_in_words(variant, result.passages)
        if switches:
            sentences.append(f"{name}'s posterior switches source {switches}.")
        elif leaders:
            sentences.append(f"{name}'s posterior stays on {plots.source_name(leaders[0], result.passages)} "
                             "for every token.")
    sentences.append("RAG-Token may take each token from another passage; RAG-Sequence weighs whole answers, "
                     "one passage at a time.")
    return " ".join(sentences)


def swap_verdict(left: AskResult, right: AskResult) -> str:
    """One sentence on what the swap showed: whether each side's answer words appear in the passages
    that side read (all k of them, not only those shown). A mention is not proof: the words may
    name something else, or come from the question."""
    if left.kb == right.kb:
        return "Both sides read the same knowledge base; choose two different ones to see a swap."
    answers = {side.kb: [v.answer for v in side.variants.values()] for side in (left, right)}
    said = {side.kb: all(v.found_in for v in side.variants.values()) for side in (left, right)}
    read = f"the {counted(left.k, 'passage')} it read" if left.k == right.k else "the passages it read"
    if answers[left.kb] != answers[right.kb]:
        if said[left.kb] and said[right.kb]:
            return (f"Same question, same model, different knowledge base: the answer changed, and each side's "
                    f"answer appears in {read}.")
        return ("The answer changed with the knowledge base, but not every answer's words appear in its side's "
                "passages: some of it may come from the model, not the index.")
    if said[left.kb] and said[right.kb]:
        return f"The same answer on both sides, and it appears in {read} on each side."
    if said[left.kb] or said[right.kb]:
        holder = left.kb if said[left.kb] else right.kb
        return f"The same answer on both sides, but it appears only in {holder}'s passages."
    return ("The same answer on both sides, and its words appear in neither side's passages: the index did not "
            "change it.")


def encoders_differ_sentence(left: AskResult, right: AskResult) -> str:
    """When the swap's two sides computed q(x) with different question encoders (a visitor's Train run took a step
    between them): a sentence saying so; "" when one encoder served both (or none: BM25)."""
    if not (left.question_encoder and right.question_encoder) or left.question_encoder == right.question_encoder:
        return ""
    return (f"The two sides were asked with different question encoders, {left.kb} with {left.question_encoder} and "
            f"{right.kb} with {right.question_encoder}: your run took a step in between. Ask both again once it has "
            "finished for one model on both sides.")


def _memory_share(variant: VariantResult) -> float | None:
    """How much of the answer ∅ memory explains: RAG-Sequence's running posterior after the whole answer,
    RAG-Token's mean over the tokens; None when memory is not a source."""
    if not variant.memory_posteriors:
        return None
    if variant.variant == "sequence":
        return variant.memory_posteriors[-1]
    return sum(variant.memory_posteriors) / len(variant.memory_posteriors)


# answers right / answers in each band on the 220 held-out everyday questions, each variant with the page's default
# options (`python -m benchmarks.sureness`, docs/results.md "How sure an answer is")
SURENESS_RIGHT = {
    ("token", "likely right"): (76, 80), ("token", "unsure"): (47, 80), ("token", "likely wrong"): (14, 57),
    ("sequence", "likely right"): (76, 81), ("sequence", "unsure"): (50, 85), ("sequence", "likely wrong"): (11, 53),
}
_BAND_RANGE = {"likely right": f"of {LIKELY_RIGHT_P:g} or more", "unsure": f"from {LIKELY_WRONG_P:g} to {LIKELY_RIGHT_P:g}",
               "likely wrong": f"under {LIKELY_WRONG_P:g}"}


def sureness_means(variant: str, band: str) -> str:
    """What a band's badge means, as its hover text says it: how often such answers were right where measured.

    >>> sureness_means("token", "likely right")[:62]
    'Answers this likely, p(y|x) of 0.2 or more, were right 76 of 8'
    """
    right, answers = SURENESS_RIGHT.get((variant, band), (0, 0))
    if not answers:
        return ""
    return (f"Answers this likely, p(y|x) {_BAND_RANGE[band]}, were right {right} of {answers} times "
            f"({100 * right / answers:.0f}%): {plots.VARIANT_NAMES[variant]}'s answers to 220 everyday questions its "
            f"settings were not tuned on, on {GENERAL_KB} with the page's default options (k = 5, flat index, "
            "Dense + BM25, memory as a source, greedy; RAG-Sequence thorough). A rate, not a verdict: read the passages "
            "either way.")


EVIDENCE_MEANS = ("Whether the answer's words appear, as whole words, in the title or text of a passage it read (lower case, "
                  "punctuation and articles dropped, a plural taken for its singular and a small number in digits for "
                  "its word (8, eight); of an answer written as a sentence, "
                  "the one run of words it adds to the question). A mention is not proof: the words may name something else; and "
                  "a passage that says it in other words is missed.")


READ_IT = ("it to see whether it answers the question", "them to see whether they answer the question")


def _ranks_in_words(ranks: Sequence[int]) -> str:
    """'passage #2', 'passages #1 and #3', 'passages #1, #2 and #4'."""
    marks = [f"#{rank}" for rank in ranks]
    return f"passage{'s' if len(marks) > 1 else ''} {listed(marks)}"


# ∅'s share of an answer's posterior under which the passages, not memory, carried it: near a half, the tokens'
# colours name ∅ as often as a passage, and "the passages carried it" would contradict them
PASSAGES_CARRIED = 0.25


def _share_in_words(share: float) -> str:
    """∅'s share of an answer's posterior as the cards write it, never a bare 0.00.

    >>> _share_in_words(0.3), _share_in_words(0.004)
    ('0.30', 'under 0.01')
    """
    return f"{share:.2f}" if share >= 0.005 else "under 0.01"


def evidence(result: AskResult, variant: VariantResult, *, generated: bool = True) -> tuple[str, str]:
    """Where an answer's words are to be found, as (kind, sentence in plain text): "passages" when some passage
    read holds them (`VariantResult.found_in`); "question" when none does but the question itself does (a text
    pasted before it, a choice it offers); "memory" when the answer is the closed-book one, or ∅ memory carries
    most of its posterior; "none" when nothing shown backs it. ("", "") for an empty answer.
    An answer the visitor gave (`generated=False`) is only placed in the passages or not."""
    if not variant.answer.strip():
        return "", ""
    if variant.found_in:
        # a mention, not a verdict: a wrong answer's words are often in a passage ("from 1961 to 1989" for "1961")
        return "passages", f"Its words are in {_ranks_in_words(variant.found_in)}; read {READ_IT[len(variant.found_in) > 1]}."
    nowhere = (f"In none of the {counted(len(result.passages), 'passage')} read" if len(result.passages) > 1
               else "Not in the passage read")
    if not generated:
        return "none", (_sentence_not_found(result) if long_answer(variant.answer) else f"{nowhere}.")
    if holds_answer(result.question, variant.answer):  # a text pasted before the question, or a choice it offers
        return "question", f"{nowhere}, but its words are in the question itself, which the generator reads too."
    closed = result.closed_book
    closed_answer = closed.answer.strip() if closed is not None else ""
    from_memory = bool(closed_answer) and exact_match(variant.answer, closed_answer)
    share = _memory_share(variant)
    if from_memory and share is not None and share < PASSAGES_CARRIED:
        # the tokens' colours name a passage, not ∅: the generator's own answer, written while reading a passage
        return "memory", (f"{nowhere}, but it is the closed-book answer: the generator alone says the same, and wrote it "
                          f"here while the passages carried its posterior (∅ memory's share {_share_in_words(share)}).")
    if from_memory or (share is not None and share > 0.5):
        if from_memory:
            return "memory", f"{nowhere}: from the generator's memory (the closed-book answer)."
        # RAG mixes memory with the passages token by token, so its answer can differ from memory's own: then neither
        # source states it, and "from memory" beside memory's other answer would read as a contradiction
        if closed_answer:
            return "memory", (f"{nowhere}, and memory alone answers otherwise (“{closed_answer}”): ∅ memory carries most "
                              f"of its posterior ({share:.2f}), mixed token by token with the passages, so neither source "
                              "states it; treat it as a guess.")
        return "memory", f"{nowhere}: mostly from the generator's memory (∅ memory's posterior is {share:.2f})."
    unlike = "" if not closed_answer else ", nor the closed-book answer"
    if long_answer(variant.answer):
        return "none", _sentence_not_found(result, other=", and it is not the closed-book answer" if closed_answer else "")
    return "none", f"{nowhere}{unlike}: nothing here backs it, so treat it as a guess."


def _sentence_not_found(result: AskResult, *, other: str = "") -> str:
    """The evidence line of an answer written as a sentence that no passage read holds: a sentence rarely repeats a
    passage word for word, so not finding it says little."""
    where = (f"any of the {counted(len(result.passages), 'passage')} read" if len(result.passages) > 1
             else "the passage read")
    return (f"Its words are not together in {where}{other}: a sentence may say in its own words what a passage says, "
            "so read them to judge it.")


def knowledge_conflicts(result: AskResult) -> list[str]:
    """A sentence for each answer that is the closed-book answer and appears in none of the passages it
    read: the generator's memory outweighed the passages (a knowledge conflict), or, where memory is the largest
    source (`plots.memory_leads`), answered where no passage matched. [] without a closed-book answer.

    An answer the passages say too is no conflict, whatever memory says; nor is one memory did not give, nor one
    the question itself holds (copied from a text pasted before it)."""
    closed = result.closed_book
    if closed is None or not closed.answer.strip():
        return []
    sentences = []
    for variant in result.variants.values():
        if not exact_match(variant.answer, closed.answer) or variant.found_in or holds_answer(result.question, variant.answer):
            continue
        share = _memory_share(variant)
        weight = "" if share is None else f"; ∅ memory's posterior on the answer is {share:.2f}"
        name = plots.VARIANT_NAMES.get(variant.variant, variant.variant)
        read = f"“{variant.answer}” is the closed-book answer and appears in none of the {counted(len(result.passages), 'passage')} it read"
        if plots.memory_leads(result):
            # no passage matches as well as memory: off the question's topic, they hold nothing to conflict with
            sentences.append(f"{result.kb}, {name}: {read}, and none matches the question as well as the generator's "
                             f"memory does (p(∅|x) = {result.memory_prob:.2f}, the largest): memory answered where the "
                             f"passages had nothing to say{weight}.")
        else:
            sentences.append(f"{result.kb}, {name}: {read}: the generator's memory outweighed the passages (a "
                             f"knowledge conflict{weight}).")
    return sentences


def as_sentence(text: str) -> str:
    """`text` with a capital first letter and a full stop.

    >>> as_sentence("the link's k is ignored")
    "The link's k is ignored."
    """
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")
