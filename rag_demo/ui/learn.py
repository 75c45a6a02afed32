"""The Learn tab: the paper's two equations worked through with the numbers of the visitor's last
answer, and the glossary of the words the page uses. Pure HTML, no gradio.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .. import plots
from ..config import BM25_SCALE
from ..results import AskResult, RetrievedPassage, VariantResult
from .html import MEMORY_SWATCH, esc, fmt_log, fmt_prob, format_status, swatch


def learn_token_choices(result: AskResult | None) -> list[tuple[str, int]]:
    """(label, position) for each RAG-Token answer token (else RAG-Sequence's)."""
    variant = _learn_variant(result)
    if variant is None:
        return []
    return [(f"{t + 1}: {plots.token_label(tok)}", t) for t, tok in enumerate(variant.tokens)]


def _learn_variant(result: AskResult | None) -> VariantResult | None:
    if result is None or not result.variants:
        return None
    return result.variants.get("token") or next(iter(result.variants.values()))


GLOSSARY = (
    ("RAG-Token, RAG-Sequence", "The paper's two ways to combine passages. RAG-Token mixes the passages again for "
                                "every token, so one answer can draw on several passages; RAG-Sequence lets one "
                                "passage explain the whole answer, then mixes the whole answers."),
    ("p(y|x)", "The probability of the whole answer y for question x, under the variant on the card: the number "
               "at the top of every answer card."),
    ("likely right, unsure, likely wrong", "How often answers as likely as this one, by p(y|x), were right on 220 "
                                           "everyday questions: about 19 in 20, 3 in 5, and 1 in 4 (RAG-Token) or "
                                           "1 in 5 (RAG-Sequence). Shown beside p(y|x) only where that was measured: "
                                           "the default models on wikipedia with the page's default options (k = 5, "
                                           "flat index, Dense + BM25, memory on, greedy, thorough RAG-Sequence) and an "
                                           "answer of a few words; otherwise a note says what differs."),
    ("hypotheses", "The candidate answers RAG-Sequence wrote (one or more per passage), each with its p(y|x); "
                   "the likeliest is the answer."),
    ("token", "A piece of text the generator reads or writes: a word, a piece of a rare word (a name may "
              "take several) or a mark such as “↵↵”, the line break that ends an answer."),
    ("p(z|x)", "How likely the retriever finds passage z for question x: a softmax (exponentiate, then divide "
               "by the sum, so the k numbers add up to 1) over the top k passages' logits. The bars of the "
               "p(z|x) chart."),
    ("score, bm25, logit", "score: the dense retriever's inner product of question and passage vectors (the "
                           "cosine similarity, as the default encoder's vectors have length 1). bm25: a word-"
                           "matching score (rare shared words count most). logit: what goes into the softmax; with "
                           f"the default encoder 20 × score, plus 0.2 × bm25 with Dense + BM25; {BM25_SCALE:g} × bm25 "
                           "with BM25 alone."),
    ("Dense, BM25, Dense + BM25", "The three retrievers. Dense is the paper's: question and passage vectors. BM25 "
                                  "matches words and needs no vectors, so it finds rare names and numbers that one "
                                  "vector blurs, but not a passage that says the same thing in other words. Dense + "
                                  "BM25 adds the two logits. “Compare retrievers” in the Ask tab shows their top k "
                                  "side by side."),
    ("question encoder", "The retriever turns the question into a vector with a question encoder, each passage "
                         "with a passage encoder. As in the paper, only the question side learns: where the offline "
                         "default has its Natural Questions knowledge bases, it is fine-tuned on about 11,000 of "
                         "their questions with their gold passages (never the questions evaluated, nor the example "
                         "questions), while the passages keep their vectors, so the index stays as built. Without "
                         "them, and until the tuning has run, the packaged encoder reads questions as it came. The "
                         "chip under each question asked names the question encoder that was used."),
    ("generator", "The language model that writes the answer after reading each passage: on the offline default, "
                  "Gemma-3-270m. Where the default has its Natural Questions knowledge bases, it reads with a small "
                  "reading adapter (a LoRA, a few MB) trained once, as the paper fine-tunes BART, on training "
                  "questions read with their gold passage: half with the real passage, half with the swapped one, "
                  "the target always what that passage says, so it learns to answer from the passage rather than "
                  "from memory. Without them it reads with its base weights and worked examples in the prompt. "
                  "The adapter is switched off for closed-book."),
    ("posterior", "After seeing the answer (or a token of it), how likely each passage is to be the one that "
                  "produced it: p(z|x) times how well z explains the text, renormalized. The heatmaps' cells."),
    ("∅ memory, p(∅|x)", "The generator's memory as one more source beside the k passages: the question read with "
                         "no passage by the base generator (the closed-book model). Its logit θ, fitted once per "
                         "setup, sits beside the passages' logits in the softmax, so p(∅|x) is large when no passage "
                         "matches, and both RAG variants mix it in as they mix a passage. The switch “Generator's "
                         "memory as a source” turns it off: the paper's k passages alone."),
    ("closed-book, parametric memory", "Closed-book: the base generator (without the reading adapter) with no "
                                       "passages, answering from what its weights remember: its parametric memory. "
                                       "Each answer token's closed-book probability and the retrieval gain compare "
                                       "against it, so they show what the passages added to what the model already "
                                       "knew. A dotted underline marks a token the closed-book model alone gives "
                                       "p ≥ 0.5."),
    ("nats, retrieval gain", "Nats are the unit of natural-log probabilities. The retrieval gain of a token is its "
                             "log p with passages minus its log p closed-book: +1 nat means the passages made it "
                             "e ≈ 2.7 times as likely; −2.3 nats, ten times less likely."),
    ("greedy, beams", "Greedy decoding takes the likeliest token at each step. Beam search keeps the best few "
                      "partial answers (Beams) and can find a likelier whole answer."),
    ("thorough, fast", "RAG-Sequence first writes one answer per passage. Thorough scores every such answer "
                       "under every passage; fast only under the passages that wrote it (the paper's two "
                       "decodings)."),
    ("recall@k", "Of the k passages exact search finds, the share an approximate index (HNSW, IVF-PQ) also "
                 "finds."),
)


def format_glossary_html() -> str:
    rows = "".join(f"<dt>{esc(term)}</dt><dd>{esc(text)}</dd>" for term, text in GLOSSARY)
    return f'<dl class="rag-glossary">{rows}</dl>'


def _with_memory(result: AskResult) -> bool:
    """Whether ∅ memory was a source of this answer (its logit and p(∅|x) are known)."""
    return result.memory_logit is not None and result.memory_prob is not None


def _sum_over(term: str, memory: bool) -> str:
    """A softmax's denominator: the sum over the passages, plus ∅'s term when memory is a source.

    >>> _sum_over("exp(ℓ(z′))", True)
    '(Σ<sub>z′</sub> exp(ℓ(z′)) + exp(θ))'
    """
    total = f"Σ<sub>z′</sub> {term}"
    return f"({total} + exp(θ))" if memory else total


def format_learn_html(result: AskResult | None, position: int | None = 0) -> str:
    """The two RAG equations worked through with this result's own numbers, ∅ memory's line in each
    when memory was a source."""
    if result is None:
        return format_status("Ask a question in the Ask tab first; this page then works through its numbers.", "info")
    passages = result.passages
    scale = result.scale
    hybrid, bm25 = result.retriever == "hybrid", result.retriever == "bm25"
    memory = _with_memory(result)
    weight = result.lexical_weight if hybrid else 0.0
    logits = [scale * p.score + weight * p.lexical for p in passages]  # for bm25, score is the BM25 score
    sources = logits + ([result.memory_logit] if memory else [])  # ∅'s logit θ is the last source's
    top = max(sources)
    weights = [math.exp(x - top) for x in sources]
    total = sum(weights)
    prior = [w / total for w in weights]  # p(z|x) recomputed from the raw scores (and θ)
    lexical_cell = (lambda p: f"<td>{p.lexical:.3f}</td>") if hybrid else (lambda p: "")
    rows = "".join(
        f"<tr><td>{_passage_cell(p)}</td>"
        f"<td>{p.score:.4f}</td>{lexical_cell(p)}<td>{lg:.3f}</td><td>{w:.4f}</td><td><b>{pr:.4f}</b></td><td>{p.prob:.4f}</td></tr>"
        for p, lg, w, pr in zip(passages, logits, weights, prior)
    )
    blank = "<td></td>" * (2 if hybrid else 1)
    if memory:  # no score: θ is the logit itself
        rows += (f"<tr><td>{MEMORY_CELL}</td>{blank}<td>θ = {result.memory_logit:.3f}</td><td>{weights[-1]:.4f}</td>"
                 f"<td><b>{prior[-1]:.4f}</b></td><td>{result.memory_prob:.4f}</td></tr>")
    k = len(passages)
    those = "that one" if k == 1 else f"those {k}"
    over = f"{those} and the generator's memory ∅" if memory else f"{those} only"
    top_k = "The top passage becomes" if k == 1 else f"The top {k} become"
    score_head = "<th>score s(z)</th>"
    if hybrid:
        how = (f"The retriever scores each passage <i>z</i> against the question <i>x</i> twice: an inner product of "
               f"their vectors, <i>s(z)</i>, as in the paper, and BM25 word matching, <i>b(z)</i>, which keeps rare "
               f"names and numbers that one vector blurs. {top_k} a distribution by a softmax "
               f"over {over}, with the encoder's scale λ = {scale:g} and BM25's weight "
               f"β = {weight:g} (choose “Dense” in the Ask tab for the paper's retriever alone):</p>"
               f'<div class="rag-eq">p(z|x) = exp(λ·s(z) + β·b(z)) / {_sum_over("exp(λ·s(z′) + β·b(z′))", memory)}</div>')
        others = "exp(λ·s(z′) + β·b(z′))"
        logit_head = "<th>bm25 b(z)</th><th>λ·s(z) + β·b(z)</th><th>exp(logit − max)</th>"
    elif bm25:
        how = (f"The retriever scores each passage <i>z</i> by BM25 word matching alone, <i>b(z)</i>: a sum over "
               "the question's words that the passage contains, each weighted by how rare it is in the knowledge "
               "base (its idf) and how often the passage repeats it. No vectors are involved, so BM25 looks at "
               f"every passage exactly. {top_k} a distribution by a softmax over {over}, "
               f"with the scale λ = {scale:g}. BM25 scores have no natural scale: at λ = 1 "
               "one rare word shared with the question would make p(z|x) all-or-nothing; λ is the weight the default "
               "Dense + BM25 gives a BM25 point (choose “Dense” in the Ask tab for the paper's retriever):</p>"
               f'<div class="rag-eq">p(z|x) = exp(λ·b(z)) / {_sum_over("exp(λ·b(z′))", memory)}</div>')
        others = "exp(λ·b(z′))"
        score_head = "<th>bm25 b(z)</th>"
        logit_head = "<th>λ·b(z)</th><th>exp(λ·b − max)</th>"
    else:
        how = (f"The retriever scores each passage <i>z</i> against the question <i>x</i> (an inner product of "
               f"their vectors, <i>s(z)</i>). {top_k} a distribution by a softmax over {over}, "
               f"with the encoder's scale λ = {scale:g}:</p>"
               f'<div class="rag-eq">p(z|x) = exp(λ·s(z)) / {_sum_over("exp(λ·s(z′))", memory)}</div>')
        others = "exp(λ·s(z′))"
        logit_head = "<th>λ·s(z)</th><th>exp(λ·s − max)</th>"
    memory_how = ""
    if memory:
        memory_how = (
            "<p>∅, the generator's memory, is one more source: the question read with no passage by the base "
            f"generator. It has no score; its logit θ = {result.memory_logit:g} is fitted for this setup, so a passage "
            "whose logit is well below θ gives way to memory. p(∅|x) is large when no passage matches:</p>"
            f'<div class="rag-eq">p(∅|x) = exp(θ) / {_sum_over(others, True)}</div>'
        )
    step1 = (
        "<h3>1 · Retrieval: how much each passage is trusted</h3>"
        f"<p>{how}{memory_how}"
        f'<div class="rag-table-scroll"><table class="rag-table"><thead><tr><th>passage</th>{score_head}{logit_head}'
        "<th>p(z|x) computed</th><th>p(z|x) engine</th></tr></thead>"
        f"<tbody>{rows}</tbody><tfoot><tr><td>sum</td><td></td>{blank}<td>{total:.4f}</td><td>{sum(prior):.4f}</td>"
        f"<td>{sum(p.prob for p in passages) + (result.memory_prob if memory else 0.0):.4f}</td></tr></tfoot></table></div>"
    )
    doc_prior = [p.prob for p in passages] + ([result.memory_prob] if memory else [])
    return f'<div class="rag-learn">{step1}{_learn_token_step(result, doc_prior, position)}{_learn_sequence_step(result, doc_prior)}</div>'


def _learn_token_step(result: AskResult, prior: Sequence[float], position: int | None) -> str:
    variant = result.variants.get("token")
    head = "<h3>2 · RAG-Token: each token may come from a different passage</h3>"
    if variant is None or not variant.tokens:
        return head + format_status("Ask with RAG-Token (or both) to see this step.", "info")
    t = min(max(int(position or 0), 0), len(variant.tokens) - 1)
    token = plots.token_label(variant.tokens[t])
    closed = math.exp(variant.closed_book_token_logprobs[t]) if t < len(variant.closed_book_token_logprobs) else float("nan")
    memory = _with_memory(result)
    doc_p = [math.exp(lp) for lp in variant.doc_token_logprobs[t]] + ([closed] if memory else [])  # ∅ reads closed-book
    joint = [a * b for a, b in zip(prior, doc_p)]
    marginal = sum(joint)
    rows = "".join(
        f"<tr><td>{cell}</td><td>{a:.4f}</td>"
        f"<td>{fmt_prob(b)}</td><td>{fmt_prob(j)}</td><td><b>{posterior:.3f}</b></td></tr>"
        for cell, a, b, j, posterior in zip(_source_cells(result), prior, doc_p, joint, engine_posterior(result, variant, t))
    )
    mixture = "the passages and ∅ memory" if memory else "the passages"
    memory_term = " + p(∅|x) · p(yᵢ | x, y&lt;i) closed-book" if memory else ""
    per_token = " + ".join(f"({fmt_log(lp)})" for lp in variant.token_logprobs)
    prefix = "".join(variant.tokens[:t])
    return (
        head
        + f"<p>Token {t + 1} of the answer is <b>“{esc(token)}”</b>"
        + (f", after “{esc(prefix.strip())}”" if prefix.strip() else "")
        + f". Its probability is a mixture over {mixture}, weighted by p(z|x):</p>"
        f'<div class="rag-eq">p(yᵢ | x, y&lt;i) = Σ<sub>z</sub> p(z|x) · p(yᵢ | x, z, y&lt;i){memory_term}</div>'
        '<div class="rag-table-scroll"><table class="rag-table"><thead><tr><th>passage</th><th>p(z|x)</th><th>p(yᵢ|x,z,y&lt;i)</th>'
        "<th>product</th><th>posterior p(z|x,yᵢ,y&lt;i)</th></tr></thead>"
        f"<tbody>{rows}</tbody><tfoot><tr><td>sum</td><td>{sum(prior):.4f}</td><td></td><td><b>{fmt_prob(marginal)}</b></td>"
        "<td>1</td></tr></tfoot></table></div>"
        f"<p>The sum, <b>{fmt_prob(marginal)}</b>, is the engine's p(yᵢ|x,y&lt;i) = "
        f"{fmt_prob(math.exp(variant.token_logprobs[t]))}. The same generator without passages gives "
        f"{fmt_prob(closed)}. The last column is the heatmap's column for this token (paper Figure 2).</p>"
        f"<p>Whole answer: log p(y|x) = Σ<sub>i</sub> log p(yᵢ|x,y&lt;i) = {per_token} = "
        f"<b>{fmt_log(sum(variant.token_logprobs))}</b> (engine: {fmt_log(variant.logprob)}).</p>"
    )


def _learn_sequence_step(result: AskResult, prior: Sequence[float]) -> str:
    variant = result.variants.get("sequence")
    head = "<h3>3 · RAG-Sequence: one passage explains the whole answer</h3>"
    if variant is None or not variant.tokens:
        return head + format_status("Ask with RAG-Sequence (or both) to see this step.", "info")
    num_docs = len(result.passages)
    memory = _with_memory(result)
    seq_lp = [sum(row[j] for row in variant.doc_token_logprobs) for j in range(num_docs)]  # log p(y|x,z)
    if memory:  # ∅ reads the answer closed-book
        seq_lp.append(sum(variant.closed_book_token_logprobs))
    joint = [a * math.exp(b) for a, b in zip(prior, seq_lp)]
    total = sum(joint)
    after = engine_posterior(result, variant, len(variant.tokens) - 1)  # the running posterior after the whole answer
    rows = "".join(
        f"<tr><td>{cell}</td><td>{a:.4f}</td>"
        f"<td>{fmt_prob(math.exp(b))}</td><td>{fmt_prob(j)}</td><td><b>{posterior:.3f}</b></td></tr>"
        for cell, a, b, j, posterior in zip(_source_cells(result), prior, seq_lp, joint, after)
    )
    memory_term = " + p(∅|x) · Π<sub>i</sub> p(yᵢ | x, y&lt;i) closed-book" if memory else ""
    note = ""
    if "fast" in variant.decoding:
        note = (" With <i>fast</i> decoding the engine takes p(y|x,z) ≈ 0 for passages whose beam did not "
                "contain y, so its number can be lower than the full sum.")
    return (
        head
        + f"<p>The answer <b>“{esc(variant.answer)}”</b> is scored as a whole under each passage"
        + (" and under ∅ memory (closed-book)" if memory else "") + ", then mixed by p(z|x):</p>"
        f'<div class="rag-eq">p(y|x) = Σ<sub>z</sub> p(z|x) · Π<sub>i</sub> p(yᵢ | x, z, y&lt;i){memory_term}</div>'
        '<div class="rag-table-scroll"><table class="rag-table"><thead><tr><th>passage</th><th>p(z|x)</th><th>p(y|x,z) = Π<sub>i</sub></th>'
        "<th>product</th><th>p(z|x,y)</th></tr></thead>"
        f"<tbody>{rows}</tbody><tfoot><tr><td>sum</td><td>{sum(prior):.4f}</td><td></td><td><b>{fmt_prob(total)}</b></td>"
        "<td>1</td></tr></tfoot></table></div>"
        f"<p>The sum, <b>{fmt_prob(total)}</b>, is p(y|x); the engine reports {fmt_prob(math.exp(variant.logprob))}."
        f"{note} The last column is the running-posterior heatmap's last column, after the whole answer.</p>"
    )


def engine_posterior(result: AskResult, variant: VariantResult, t: int) -> list[float]:
    """Token t's column of the variant's heatmap, as the engine gave it: each passage's posterior, then
    ∅ memory's when it was a source. The worked columns beside it are the arithmetic that yields it;
    the last column is read, not recomputed, so that the page shows one posterior everywhere."""
    return list(variant.posteriors[t]) + ([variant.memory_posteriors[t]] if _with_memory(result) else [])


def _passage_cell(p: RetrievedPassage) -> str:
    return f"{swatch(p.rank)}#{p.rank} {esc(plots.shorten(plots.passage_name(p.title, p.text), 28))}"


MEMORY_CELL = f"{MEMORY_SWATCH}{esc(plots.MEMORY_NAME)}"


def _source_cells(result: AskResult) -> list[str]:
    """A table's first column: each passage, then ∅ memory when it was a source."""
    return [_passage_cell(p) for p in result.passages] + ([MEMORY_CELL] if _with_memory(result) else [])
