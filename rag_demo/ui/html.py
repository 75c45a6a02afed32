"""Results -> HTML for the page. Pure functions, no gradio: every string that did not come from
this file (questions, passages, tokens, knowledge-base names) is escaped here.

The answer cards tint each token by the source that dominates its posterior (a passage, or the
generator's memory ∅ when it is a source); the swap's summary and the scored answer have a formatter
each. The passage cards are passage_cards.py's.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence

from .. import plots
from ..generation.restatements import restates_question
from ..retrieval.corpus import KnowledgeBase
from ..progress import counted
from ..results import AskResult, ClosedBookResult, RetrievedPassage, RetrieverRanking, VariantResult
from .sentences import (EVIDENCE_MEANS, LINE_BREAK_NOTE, SCORED_LINE_BREAK_NOTE, SPACE_TOKEN_NOTE, as_sentence,
                        disagreement_sentence, encoders_differ_sentence, evidence, fmt_prob, knowledge_conflicts,
                        memory_sentence, sureness_means, swap_verdict)

PARAMETRIC_P = 0.5  # closed-book p at or above which a token is marked as coming from parametric memory
TIMING_ORDER = ("encode", "search", "recall check", "generate", "total")
TIMING_MEANS = {"search": "finding and weighing the passages: the index's search, and with Dense + BM25 the BM25 "
                          "scores of every passage and the exact inner products of the candidates (the Index variants "
                          "tab times the index's search alone)",
                "recall check": "the exact search an approximate index's recall is measured against: a check this page "
                                "makes, not part of answering, and not in the search time"}


def esc(text: object) -> str:
    """HTML-escape any value, quotes included.

    >>> esc('<img src=x onerror="1">')
    '&lt;img src=x onerror=&quot;1&quot;&gt;'
    """
    return html.escape(str(text), quote=True)


def fmt_signed(x: float, digits: int = 2) -> str:
    """A signed number with a true minus sign, as `fmt_log` writes them.

    >>> fmt_signed(-2.494), fmt_signed(0.871)
    ('−2.49', '+0.87')
    """
    return f"{x:+.{digits}f}".replace("-", "−")


def fmt_log(lp: float) -> str:
    """A log-probability with a true minus sign.

    >>> fmt_log(-0.3104)
    '−0.310'
    """
    if math.isinf(lp):
        return "−∞" if lp < 0 else "∞"
    return f"{lp:.3f}".replace("-", "−")


def fmt_ms(ms: float) -> str:
    """Milliseconds for people, seconds past 1000.

    >>> fmt_ms(0.04), fmt_ms(12.34), fmt_ms(4321)
    ('0.04 ms', '12.3 ms', '4.32 s')
    """
    if ms >= 1000:
        return f"{ms / 1000:.3g} s"
    return f"{ms:.3g} ms"


def format_status(message: str, kind: str = "error") -> str:
    """A visible message box; kind is 'error', 'info' or 'ok'. Empty message -> empty HTML."""
    if not message:
        return ""
    role = "alert" if kind == "error" else "status"
    return f'<div class="rag-status rag-status-{esc(kind)}" role="{role}">{esc(message)}</div>'


def _is_special(token: str) -> bool:
    stripped = token.strip()
    return len(stripped) > 2 and ((stripped[0] == "<" and stripped[-1] == ">") or (stripped[0] == "[" and stripped[-1] == "]"))


def _ends_answer(tokens: Sequence[str], t: int) -> bool:
    """The last token is a line break or a special token: the generator's stop, not a word."""
    if t != len(tokens) - 1:
        return False
    token = tokens[t]
    return (token.strip() == "" and "\n" in token) or _is_special(token)


def _token_text(token: str) -> str:
    """Escaped token text as shown inline: newlines visible, special tokens kept short, a token of spaces alone as a
    faint ␣ (a tokenizer that writes digits one by one puts a space token before " 8"; it drew an empty chip)."""
    if token == "":
        return "∅"
    if token.strip() == "" and "\n" not in token:
        return '<span class="rag-tok-space">␣</span>'
    return esc(token).replace("\n", "↵")


def swatch(rank: int) -> str:
    """A small square in the colour of the passage at `rank`, as the charts draw it."""
    return f'<span class="rag-swatch" style="background:{plots.passage_color(rank)}"></span>'


MEMORY_SWATCH = f'<span class="rag-swatch" style="background:{plots.MEMORY_COLOR}"></span>'
MEMORY_MEANS = ("The generator's own memory: the question read with no passage by the base generator (the "
                "closed-book model). p(∅|x) is its share beside the k passages, large when no passage matches well, "
                "and both RAG variants mix it in as one more source.")
MEMORY_UNAVAILABLE = ("The generator's memory is not a source here: this setup has no fitted logit for it, so p(z|x) "
                      "is over the k passages alone, as in the paper.")
# θ is fitted against the packaged bases' logits (`RagEngine.ask`)
MEMORY_UNAVAILABLE_OWN_KB = ("The generator's memory is not a source here: its logit was fitted on the packaged "
                             "knowledge bases, not on this one, so p(z|x) is over these passages alone, as in the paper.")
# its logit θ is fitted for the packaged question encoder, whose logits a trained one moves (`RagEngine.ask`)
MEMORY_UNAVAILABLE_TRAINED = ("The generator's memory is not a source here: it has no fitted logit with a question "
                              "encoder trained on this page, so p(z|x) is over the k passages alone, as in the paper "
                              "and in training.")


def memory_switch_info(logit: float | None) -> str:
    """The memory switch's help text, for a setup with this memory logit (None: none fitted)."""
    if logit is None:
        return ("Unavailable with this setup: it has no fitted logit for the generator's memory, so p(z|x) stays "
                "over the k passages, as in the paper.")
    return (f"∅, the generator reading no passage, joins the k passages in p(z|x) with logit θ = {logit:.2f}; "
            "untick for the paper's k passages alone.")


def _source(j: int, passages: Sequence[RetrievedPassage]) -> tuple[str, str, str] | None:
    """Column j of a posterior row as (colour, short name, name for the tooltip, escaped): passage j,
    or ∅ memory just past the passages; None past that."""
    if j < len(passages):
        p = passages[j]
        return (plots.passage_color(p.rank), f"passage #{p.rank}",
                f"#{p.rank} {esc(plots.shorten(plots.passage_name(p.title, p.text), 26))}")
    if j == len(passages):
        return plots.MEMORY_COLOR, "∅ memory", esc(plots.MEMORY_NAME)
    return None


def _source_mark(j: int, passages: Sequence[RetrievedPassage]) -> str:
    """Column j of a posterior row as the cards mark it beside the colour: '#rank' (so that after an answer's
    digits it cannot read as one more digit), or ∅."""
    return f"#{passages[j].rank}" if j < len(passages) else "∅"


def format_token_spans(variant: VariantResult, passages: Sequence[RetrievedPassage], *, max_tip_rows: int = 6) -> str:
    """The answer's tokens, each tinted by the source that dominates its posterior, with a hover tooltip.

    Tint: colour of argmax_z posterior (a passage's, or ∅ memory's grey when memory is a source),
    opacity grows with that posterior. Tooltip: the token's probability with passages, its
    closed-book probability, and its posterior over the sources.
    """
    spans = []
    kind = "running posterior p(z | x, y≤i)" if variant.variant == "sequence" else "posterior p(z | x, yᵢ, y<i)"
    posteriors = plots.source_posteriors(variant)
    leaders = [max(range(len(row)), key=row.__getitem__) if row else None for row in posteriors]
    for t, token in enumerate(variant.tokens):
        row = posteriors[t] if t < len(posteriors) else ()
        p_open = math.exp(variant.token_logprobs[t]) if t < len(variant.token_logprobs) else float("nan")
        p_closed = (math.exp(variant.closed_book_token_logprobs[t])
                    if t < len(variant.closed_book_token_logprobs) else float("nan"))
        classes = ["rag-tok"]
        style = ""
        best = max(range(len(row)), key=row.__getitem__) if row else None
        leader = _source(best, passages) if best is not None else None
        if leader is not None:
            style = f' style="background:{plots.rgba(leader[0], 0.12 + 0.6 * row[best])}"'
        ending = _ends_answer(variant.tokens, t)
        if _is_special(token) or ending:
            classes.append("rag-special")
        if p_closed >= PARAMETRIC_P:
            classes.append("rag-parametric")
        order = sorted(range(len(row)), key=lambda j: -row[j])[:max_tip_rows]
        rows = []
        for j in order:
            source = _source(j, passages)
            if source is None:
                continue
            color, _, name = source
            width = max(1.0, 100 * row[j])
            rows.append(
                f'<div class="rag-tip-row"><span class="rag-swatch" style="background:{color}"></span>'
                f'<span class="rag-tip-title">{name}</span><span class="rag-tip-bar">'
                f'<span style="width:{width:.0f}%;background:{color}"></span></span>'
                f'<span class="rag-tip-num">{row[j]:.2f}</span></div>'
            )
        hidden = len(row) - len(order)
        more = f'<div class="rag-tip-more">+{hidden} more below {row[order[-1]]:.2f}</div>' if hidden > 0 and order else ""
        gain = (variant.token_logprobs[t] - variant.closed_book_token_logprobs[t]
                if t < min(len(variant.token_logprobs), len(variant.closed_book_token_logprobs)) else float("nan"))
        closed_known = not math.isnan(p_closed)  # an ask with closed_book=False and no memory has none
        label = f"“{plots.token_label(token)}”: p {fmt_prob(p_open)}" + (
            f", closed-book p {fmt_prob(p_closed)}" if closed_known else "")
        if leader is not None:
            label += f", mostly {leader[1]} ({row[best]:.2f})"
        about = kind
        if ending:
            label += "; it ends the answer"
            about = f"the stop token: it ends the answer, and its probability is part of p(y|x) · {kind}"
        tip = (
            f'<span class="rag-tip" role="tooltip"><span class="rag-tip-head">“{esc(plots.token_label(token))}”</span>'
            f'<span class="rag-tip-probs">p = {fmt_prob(p_open)} with passages'
            + (f' · <b>{fmt_prob(p_closed)}</b> closed-book · gain {fmt_signed(gain)} nats' if closed_known else "")
            + f'</span><span class="rag-tip-kind">{esc(about)}</span>{"".join(rows)}{more}</span>'
        )
        # the leading source's number beside its colour, for readers who cannot tell the colours apart; once
        # at the end of a run of tokens from one source, so that "8,848.86 m" stays readable as a number
        run_ends = (t + 1 >= len(leaders) or leaders[t + 1] != best
                    or _is_special(variant.tokens[t + 1]) or _ends_answer(variant.tokens, t + 1))
        mark = (f'<span class="rag-tok-src" aria-hidden="true">{_source_mark(best, passages)}</span>'
                if leader is not None and run_ends else "")
        spans.append(
            f'<span class="{" ".join(classes)}" tabindex="0" role="img" aria-roledescription="answer token" '
            f'aria-label="{esc(label)}"{style}><span class="rag-tok-text">{_token_text(token)}</span>{mark}{tip}</span>'
        )
    return _in_words(spans, variant.tokens)


# a run of tokens longer than this is left free to break: kept whole, it could run out of a phone's card
WORD_MAX_TOKENS = 6


def _in_words(spans: Sequence[str], tokens: Sequence[str]) -> str:
    """The tokens' spans, each word's kept on one line ("Montes|qu|ieu" broke after "qu"): a word is a run of
    tokens that neither starts nor follows a space, a line break or a special token.

    >>> _in_words(["<a>", "<b>", "<c>"], [" Montes", "qu", "ieu"])
    '<span class="rag-word"><a><b><c></span>'
    >>> _in_words(["<a>", "<b>"], [" Jane", " Austen"])
    '<a><b>'
    """
    words: list[list[str]] = []
    for t, (span, token) in enumerate(zip(spans, tokens)):
        joins = (t > 0 and token[:1] != "" and not token[:1].isspace() and not tokens[t - 1][-1:].isspace()
                 and not _is_special(token) and not _is_special(tokens[t - 1]))
        if joins:
            words[-1].append(span)
        else:
            words.append([span])
    return "".join(f'<span class="rag-word">{"".join(word)}</span>' if 1 < len(word) <= WORD_MAX_TOKENS
                   else "".join(word) for word in words)


def format_closed_book_spans(closed: ClosedBookResult) -> str:
    """Closed-book tokens in grey, darker when the model is surer; the tooltip gives p."""
    spans = []
    for t, (token, lp) in enumerate(zip(closed.tokens, closed.token_logprobs)):
        p = math.exp(lp)
        classes = "rag-tok rag-closed" + (" rag-special" if _is_special(token) or _ends_answer(closed.tokens, t) else "")
        spans.append(
            f'<span class="{classes}" tabindex="0" role="img" aria-roledescription="answer token" '
            f'aria-label="{esc(plots.token_label(token))}: closed-book p {fmt_prob(p)}"'
            f' style="background:rgba(107,114,128,{0.1 + 0.45 * p:.3f})"><span class="rag-tok-text">{_token_text(token)}'
            f'</span><span class="rag-tip" role="tooltip"><span class="rag-tip-head">“{esc(plots.token_label(token))}”</span>'
            f'<span class="rag-tip-probs">closed-book p = {fmt_prob(p)} (no passages)</span></span></span>'
        )
    return _in_words(spans, closed.tokens)


_TIMING_TITLES = {k: f' title="{esc(means)}"' for k, means in TIMING_MEANS.items()}


def format_timings(timings_ms: dict[str, float]) -> str:
    """'encode 3 ms · search 0.4 ms · ...' with the known stages first."""
    keys = [k for k in TIMING_ORDER if k in timings_ms] + sorted(k for k in timings_ms if k not in TIMING_ORDER)
    parts = [f"<span{_TIMING_TITLES.get(k, '')}>{esc(k)} <b>{fmt_ms(float(timings_ms[k]))}</b></span>" for k in keys]
    return f'<div class="rag-timings" title="time spent in each stage">time: {" · ".join(parts)}</div>'


RETRIEVER_BADGES = {  # (badge text, what its p(z|x) is)
    "dense": ("dense", "the dense retriever's scores, as in the paper"),
    "bm25": ("BM25", "BM25 word matching alone, no vectors"),
    "hybrid": ("dense + BM25", "the dense retriever's score plus BM25 word matching"),
}


def format_retriever_badge(result: AskResult | RetrieverRanking) -> str:
    """'dense' / 'BM25' / 'dense + BM25', its p(z|x) formula in the tooltip."""
    text, what = RETRIEVER_BADGES.get(result.retriever, (result.retriever, "the retriever's scores"))
    return (f'<span class="rag-badge" title="p(z|x) = softmax({esc(plots.logit_formula(result))}) over the top k: '
            f'{esc(what)}">{esc(text)}</span>')


def format_encoder_badge(result: AskResult) -> str:
    """Which question encoder computed q(x) ('question encoder: minilm'); "" when none did (BM25)."""
    if not result.question_encoder:
        return ""
    return ('<span class="rag-badge rag-badge-encoder" title="the question encoder that computed q(x), the '
            "question's vector; the passages' vectors and the index are the knowledge base's\">"
            f"question encoder: {esc(result.question_encoder)}</span>")


def question_text(question: str) -> str:
    """'Q: ...' above an answer, escaped, in a box of its own so that a long question scrolls there and the
    badges beside it stay whole."""
    return f'<span class="rag-question-text">Q: {esc(question)}</span>'


def format_index_badge(result: AskResult) -> str:
    """The index variant's badge, then the retriever's and the question encoder's."""
    if result.retriever == "bm25":  # BM25 reads no vector index: say so, whatever index was chosen
        return ('<span class="rag-badge" title="BM25 scores every passage; the index variants hold dense vectors">'
                f"exact search · no index</span>{format_retriever_badge(result)}")
    if result.index_recall is not None:
        recall = f"recall@{result.k} {result.index_recall:.2f}"
    else:
        recall = "exact search" if result.index == "flat" else f"recall@{result.k} n/a"
    title = ("the flat index compares the question with every passage: exact search, the passages the paper's MIPS "
             "returns" if result.index == "flat" and result.index_recall is None else
             "recall@k: of the k passages exact (flat) search gives this question, the share this index variant shows")
    return (f'<span class="rag-badge" title="{title}">index {esc(result.index)} · {recall}</span>'
            f"{format_retriever_badge(result)}{format_encoder_badge(result)}")


SET_ASIDE_MEANS = ("every word of these answers is already in the question, so decoding set them aside and "
                   "decoded again without their first word; the answer shown is the model's next choice")


def format_set_aside(set_aside: Sequence[str]) -> str:
    """A line under an answer naming the answers decoding set aside as restating the question; "" for none."""
    if not set_aside:
        return ""
    quoted = ", ".join(f"“{esc(plots.shorten(text, 40))}”" for text in set_aside)
    return f'<div class="rag-cands rag-set-aside" title="{esc(SET_ASIDE_MEANS)}">set aside, restates the question: {quoted}</div>'


def format_evidence(result: AskResult, variant: VariantResult, *, generated: bool = True) -> str:
    """A line under an answer saying which passages hold its words, or that none does; "" for an empty answer."""
    kind, sentence = evidence(result, variant, generated=generated)
    if not kind:
        return ""
    return f'<div class="rag-evidence rag-evidence-{kind}" title="{esc(EVIDENCE_MEANS)}">{esc(sentence)}</div>'


def format_sureness(variant: VariantResult) -> str:
    """The answer's band (`sureness`) as a badge, or "" where none was measured."""
    if not variant.sureness:
        return ""
    kind = variant.sureness.replace(" ", "-")
    return (f' · <span class="rag-sure rag-sure-{esc(kind)}" title="{esc(sureness_means(variant.variant, variant.sureness))}">'
            f'{esc(variant.sureness)}</span>')


HYPOTHESES_MEAN = ("RAG-Sequence's candidate answers, each decoded from one source and scored by p(y|x) over all of "
                   "them. The same words can come twice as different token sequences (\"1840\" written as one token or "
                   "as four digits, another ending): each sequence is its own hypothesis with its own probability. "
                   "One marked as restating the question is one decoding sets aside as an answer.")


def _undecodable_runs(text: str) -> str:
    """Runs of byte tokens that decode to no character (a small generator can write them after an emoji), counted
    instead of drawn as a row of �.

    >>> _undecodable_runs("ab\ufffd\ufffd\ufffd"), _undecodable_runs("caf\ufffd")
    ('ab[3 bytes that are not text]', 'caf\ufffd')
    """
    return re.sub("\ufffd{2,}", lambda run: f"[{len(run.group())} bytes that are not text]", text)


def _variant_card(variant: VariantResult, passages: Sequence[RetrievedPassage], *, question: str = "",
                  extra: str = "") -> str:
    name = plots.VARIANT_NAMES.get(variant.variant, variant.variant)
    candidates = ""
    if variant.candidates:
        seen: set[str] = set()
        shown = []
        for text, lp in variant.candidates[:4]:
            label = f"“{esc(plots.shorten(_undecodable_runs(text), 30))}”" if text.strip() else "(empty answer)"
            if text in seen:  # one text, two token sequences (another ending or another split into tokens)
                label += " (same words, other tokens)"
            elif question and text.strip() and restates_question(question, text):
                label += " (restates the question)"
            seen.add(text)
            shown.append(f"{label} {fmt_prob(math.exp(lp))}")
        candidates = (f'<div class="rag-cands" title="{esc(HYPOTHESES_MEAN)}">hypotheses p(y|x): {", ".join(shown)}'
                      '</div>')
    if not variant.answer.strip():
        candidates = '<div class="rag-cands">(empty answer: the model ended it at once)</div>' + candidates
    return (
        f'<div class="rag-card rag-card-{esc(variant.variant)}">'
        f'<div class="rag-card-head"><span class="rag-kind">{esc(name)}</span>'
        f'<span class="rag-meta">p(y|x) = <b>{fmt_prob(math.exp(variant.logprob))}</b> · log {fmt_log(variant.logprob)}'
        f' · {esc(variant.decoding)}{format_sureness(variant)}</span></div>'
        f'<div class="rag-answer-text">{format_token_spans(variant, passages)}</div>{format_set_aside(variant.set_aside)}'
        f'{candidates}{extra}</div>'
    )


def _closed_card(closed: ClosedBookResult) -> str:
    return (
        '<div class="rag-card rag-card-closed">'
        '<div class="rag-card-head"><span class="rag-kind">Closed-book</span>'
        f'<span class="rag-meta">same generator, no passages · p(y|x) = <b>{fmt_prob(math.exp(closed.logprob))}</b></span></div>'
        f'<div class="rag-answer-text">{format_closed_book_spans(closed)}</div>{format_set_aside(closed.set_aside)}</div>'
    )


def format_notices(notices: Sequence[str]) -> str:
    """Each notice as a sentence on the page; the JSON and the command line keep the engine's lower-case phrases."""
    return "".join(f'<div class="rag-notice">{esc(as_sentence(n))}</div>' for n in notices)


def format_memory_line(result: AskResult) -> str:
    """One line under the question: p(∅|x) and what it means; empty when memory is not a source."""
    sentence = memory_sentence(result)
    if not sentence:
        return ""
    lead = " rag-memory-lead" if plots.memory_leads(result) else ""
    return f'<div class="rag-memory-line{lead}" title="{esc(MEMORY_MEANS)}">{MEMORY_SWATCH}{esc(sentence)}</div>'


def line_break_note(token_lists: Sequence[Sequence[str]], *, scored: bool = False) -> str:
    """A note on “↵” when some shown token holds a line break (of an answer the visitor gave, `scored`: the stop
    scoring adds), and on “␣” when one is spaces alone; "" otherwise."""
    shown = [token for tokens in token_lists for token in tokens]
    notes = [note for note, used in ((SCORED_LINE_BREAK_NOTE if scored else LINE_BREAK_NOTE,
                                      any("\n" in token for token in shown)),
                                     (SPACE_TOKEN_NOTE, any(token and not token.strip(" ") for token in shown))) if used]
    return "".join(f'<div class="rag-legend rag-line-break-note">{esc(note)}</div>' for note in notes)


def format_disagreement(result: AskResult) -> str:
    sentence = disagreement_sentence(result)
    return f'<div class="rag-disagree" role="note">{esc(sentence)}</div>' if sentence else ""


def format_answer_html(result: AskResult, *, closed_book: bool = True, legend: bool = True, question: bool = True) -> str:
    """Answer cards (one per variant, plus closed-book), p(∅|x) when memory is a source, the index's
    recall, notices and timings."""
    cards = [_variant_card(v, result.passages, question=result.question, extra=format_evidence(result, v))
             for v in result.variants.values()]
    if closed_book and result.closed_book is not None:
        cards.append(_closed_card(result.closed_book))
    memory = (" or grey for ∅, the generator's memory," if result.memory_prob is not None else "")
    legend_html = (
        f'<div class="rag-legend">Token colour = the passage{memory} that dominates its posterior (stronger = surer); '
        f'dotted underline = the closed-book model alone gives it p ≥ {PARAMETRIC_P:g} (parametric memory). '
        f"The small #number after a run of tokens is the source with the largest share of their posterior"
        f"{' (∅: memory)' if memory else ''}, however small: a pale token leans on it barely. "
        "Hover or focus a token for its posterior and closed-book probability."
        + (" With one source, every token's posterior is all on it: the colour says that passage was read, not that it "
           "holds the answer." if len(result.passages) + (result.memory_prob is not None) == 1 else "") + "</div>"
        if legend else ""
    )
    shown = [v.tokens for v in result.variants.values()]
    if closed_book and result.closed_book is not None:
        shown.append(result.closed_book.tokens)
    head = (f'<div class="rag-question">{question_text(result.question)} <span class="rag-kb">knowledge base '
            f'<b>{esc(result.kb)}</b></span> {format_index_badge(result)}</div>' if question else "")
    return (
        f'<div class="rag-answer-block">{head}{format_notices(result.notices)}{format_memory_line(result)}'
        f'<div class="rag-cards">{"".join(cards)}</div>{format_disagreement(result)}{legend_html}'
        f'{line_break_note(shown)}{format_timings(result.timings_ms)}</div>'
    )


def format_swap_summary(left: AskResult, right: AskResult) -> str:
    """Each side's answers, the closed-book answer, the verdict, and any knowledge conflict in words."""
    def answers(r: AskResult) -> str:
        named = len(r.variants) > 1  # with both variants, each answer says whose it is
        return " / ".join((f"{plots.VARIANT_NAMES.get(v.variant, v.variant)} " if named else "") + f"“{esc(v.answer)}”"
                          for v in r.variants.values())

    closed = next((r.closed_book for r in (left, right) if r.closed_book is not None), None)
    memory = (f' &nbsp;|&nbsp; closed-book, no passages → “{esc(closed.answer)}”' if closed is not None else "")
    verdict = esc(swap_verdict(left, right))
    encoders = encoders_differ_sentence(left, right)
    encoders = f"<div>{esc(encoders)}</div>" if encoders else ""
    conflicts = "".join(f'<div class="rag-conflict">{esc(sentence)}</div>'
                        for side in (left, right) for sentence in knowledge_conflicts(side))
    return (f'<div class="rag-swap-summary"><b>{esc(left.kb)}</b> → {answers(left)} &nbsp;|&nbsp; '
            f'<b>{esc(right.kb)}</b> → {answers(right)}{memory}<div>{verdict}</div>{encoders}{conflicts}</div>')


def format_priors(result: AskResult) -> str:
    """One line: p(z|x) of each passage read, in the colours that tint the tokens, and p(∅|x) when memory is a
    source; "" with no passages. The question encoder (its badge) is what moves these."""
    if not result.passages:
        return ""
    parts = [f'<span class="rag-prior" data-row="{esc(p.id)}">{swatch(p.rank)}{plots.passage_label(p, 28)} '
             f"<b>{p.prob:.3f}</b></span>" for p in result.passages]
    if result.memory_prob is not None:
        parts.append(f'<span class="rag-prior">{MEMORY_SWATCH}{esc(plots.MEMORY_NAME)} <b>{fmt_prob(result.memory_prob)}</b></span>')
    return f'<div class="rag-cands rag-priors">p(z|x) of the passages read: {" · ".join(parts)}</div>'


def format_score_html(result: AskResult) -> str:
    """log p(answer|x) under each variant against the closed-book model, with per-token provenance, and the
    p(z|x) it was marginalized over."""
    cards = []
    for v in result.variants.values():
        closed_lp = sum(v.closed_book_token_logprobs)
        split = ""
        last = len(v.tokens) - 1
        if last > 0 and _ends_answer(v.tokens, last) and last < min(len(v.token_logprobs), len(v.closed_book_token_logprobs)):
            # the stop token's gain can cancel the words' gain; show them apart
            end_gain = v.token_logprobs[last] - v.closed_book_token_logprobs[last]
            words_gain = sum(v.token_logprobs[:last]) - sum(v.closed_book_token_logprobs[:last])
            split = (f": {fmt_signed(words_gain)} for the words, {fmt_signed(end_gain)} for ending the answer there "
                     f"(“{_token_text(v.tokens[last])}”)")
        extra = (f'<div class="rag-cands">closed-book log p = {fmt_log(closed_lp)} → the passages change it by '
                 f"<b>{fmt_signed(v.logprob - closed_lp)}</b> nats{split}</div>{format_evidence(result, v, generated=False)}")
        cards.append(_variant_card(v, result.passages, extra=extra))
    return (
        f'<div class="rag-answer-block"><div class="rag-question">{question_text(result.question)} '
        f'<span class="rag-kb">knowledge base <b>{esc(result.kb)}</b></span> {format_index_badge(result)}</div>'
        f'{format_notices(result.notices)}{format_memory_line(result)}{format_priors(result)}'
        f'<div class="rag-cards">{"".join(cards)}</div>'
        f'{line_break_note([v.tokens for v in result.variants.values()], scored=True)}{format_timings(result.timings_ms)}</div>'
    )


def format_kb_preview(kb: KnowledgeBase, *, limit: int = 50) -> str:
    items = "".join(
        f'<li><span class="rag-passage-title">{esc(plots.passage_name(kb.titles[i], kb.texts[i]))}</span> '
        f'<span class="rag-passage-text">{esc(plots.shorten(kb.texts[i], 160))}</span></li>'
        for i in range(min(limit, len(kb)))
    )
    more = f"<div class='rag-empty'>… and {len(kb) - limit:,} more</div>" if len(kb) > limit else ""
    return f'<div class="rag-preview"><div><b>{counted(len(kb), "passage")}</b></div><ol>{items}</ol>{more}</div>'


def passage_choices(kb: KnowledgeBase) -> list[tuple[str, int]]:
    return [(f"{i + 1}. {plots.shorten(plots.passage_name(kb.titles[i], kb.texts[i]), 30)} — {plots.shorten(kb.texts[i], 50)}", i)
            for i in range(len(kb))]
