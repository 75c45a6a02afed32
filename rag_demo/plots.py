"""Results -> plotly figures. Pure functions; plotly is imported inside them.

Every label that came from a passage, a question or a token is HTML-escaped first:
plotly renders a small subset of HTML (<b>, <br>, <a href>) in titles, ticks and hovers.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from .config import VARIANT_NAMES
from .results import AskResult, IndexReport, RetrievedPassage, RetrieverRanking, VariantResult

# Colour-blind-friendly qualitative palette (Tableau 10); passage rank r gets PALETTE[(r - 1) % 10].
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
VARIANT_COLORS = {"token": "#4338ca", "sequence": "#0f766e"}
# The generator's memory ∅ in every chart and card: the closed-book card's grey, since ∅ is that same
# generator reading the question with no passage.
MEMORY_COLOR = "#6b7280"
MEMORY_NAME = "∅ memory"
MEMORY_WHAT = "no passage: the generator's own memory"
FONT = dict(family="ui-sans-serif, system-ui, sans-serif", size=14, color="#1f2937")  # 14 px: legible projected


def passage_color(rank: int) -> str:
    """The colour of the passage at 1-based `rank`.

    >>> passage_color(1), passage_color(11)
    ('#4e79a7', '#4e79a7')
    """
    return PALETTE[(rank - 1) % len(PALETTE)]


def _luminance(hex_color: str) -> float:
    """WCAG's relative luminance of '#rrggbb'."""
    def channel(value: int) -> float:
        c = value / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(int(hex_color[i : i + 2], 16)) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def text_color_on(hex_color: str) -> str:
    """White or near-black, whichever reads better on `hex_color` (WCAG contrast).

    >>> text_color_on("#4e79a7"), text_color_on("#edc948")
    ('#ffffff', '#111827')
    """
    background = _luminance(hex_color)
    on_white = 1.05 / (background + 0.05)
    on_black = (background + 0.05) / (_luminance("#111827") + 0.05)
    return "#ffffff" if on_white >= on_black else "#111827"


def rgba(hex_color: str, alpha: float) -> str:
    """'#rrggbb' plus an opacity -> a CSS rgba() string.

    >>> rgba("#ff0000", 0.5)
    'rgba(255, 0, 0, 0.500)'
    """
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {min(max(alpha, 0.0), 1.0):.3f})"


def shorten(text: str, width: int) -> str:
    """`text` cut to `width` characters with an ellipsis.

    >>> shorten("A Farewell to Arms", 10)
    'A Farewel…'
    """
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def token_label(token: str) -> str:
    """A token as a short visible label: whitespace made visible, never empty; one ↵ per line break, as the
    answer cards show them.

    >>> token_label(" Paris"), token_label("\\n"), token_label("\\n\\n"), token_label(" ")
    ('Paris', '↵', '↵↵', '␣')
    """
    shown = token.strip().replace("\n", "↵")
    return shown or "↵" * token.count("\n") or "␣"


def passage_name(title: str, text: str) -> str:
    """A passage's title, or its opening words when it has none (plain text, not escaped).

    >>> passage_name("", "Notes on the State of Virginia is a book")
    '“Notes on the State of…”'
    """
    if title.strip():
        return title.strip()
    opening = " ".join(text.split()[:5])
    return f"“{opening}…”" if opening else "untitled"


def source_posteriors(variant: VariantResult) -> list[tuple[float, ...]]:
    """(T, K), or (T, K + 1) when memory is a source: each token's posterior over the passages, then ∅'s.

    >>> v = VariantResult("token", "a", ("a",), (1,), -1.0, (-1.0,), ((-1.0, -2.0),), ((0.5, 0.2),), (-0.5,),
    ...                   memory_posteriors=(0.3,))
    >>> source_posteriors(v)
    [(0.5, 0.2, 0.3)]
    """
    if not variant.memory_posteriors:
        return [tuple(row) for row in variant.posteriors]
    return [(*row, memory) for row, memory in zip(variant.posteriors, variant.memory_posteriors)]


def leading_sources(variant: VariantResult) -> list[int]:
    """(T,) for each token the column of `source_posteriors` with the largest posterior (K: ∅ memory).

    >>> v = VariantResult("token", "ab", ("a", "b"), (1, 2), -1.0, (-0.5, -0.5), ((0, 0), (0, 0)),
    ...                   ((0.7, 0.3), (0.2, 0.8)), (-1.0, -1.0))
    >>> leading_sources(v)
    [0, 1]
    """
    return [max(range(len(row)), key=row.__getitem__) for row in source_posteriors(variant) if row]


def source_switches(variant: VariantResult) -> list[tuple[int, int, int]]:
    """(token position, column before, column after) wherever the leading source changes from one token
    to the next: where RAG-Token takes the next words from another passage (Figure 2's jumps).

    >>> v = VariantResult("token", "abc", ("a", "b", "c"), (1, 2, 3), -1.0, (-0.3,) * 3, ((0, 0),) * 3,
    ...                   ((0.9, 0.1), (0.9, 0.1), (0.4, 0.6)), (-1.0,) * 3)
    >>> source_switches(v)
    [(2, 0, 1)]
    """
    leaders = leading_sources(variant)
    return [(t, leaders[t - 1], leaders[t]) for t in range(1, len(leaders)) if leaders[t] != leaders[t - 1]]


def source_name(column: int, passages: Sequence[RetrievedPassage]) -> str:
    """A column of `source_posteriors` in words: 'passage #3' or '∅ memory' (plain text)."""
    return f"passage #{passages[column].rank}" if column < len(passages) else MEMORY_NAME


def _counts_in_words(leaders: Sequence[int], passages: Sequence[RetrievedPassage]) -> str:
    counts: dict[int, int] = {}
    for column in leaders:
        counts[column] = counts.get(column, 0) + 1
    ordered = sorted(counts.items(), key=lambda item: -item[1])
    return ", ".join(f"{source_name(c, passages)} on {n} token{'s' if n != 1 else ''}" for c, n in ordered)


def describe_doc_prob(result: AskResult) -> str:
    """The p(z|x) bar chart in one sentence, for a screen reader (plain text)."""
    if not result.passages:
        return "Bar chart of p(z|x): no passages."
    top = max(result.passages, key=lambda p: p.prob)
    memory = f"; ∅ memory has {result.memory_prob:.2f}" if result.memory_prob is not None else ""
    return (f"Bar chart of p(z|x) over the top {len(result.passages)} passages: passage #{top.rank}, "
            f"{shorten(passage_name(top.title, top.text), 40)}, has the most, {top.prob:.2f}{memory}.")


def describe_heatmap(variant: VariantResult, passages: Sequence[RetrievedPassage]) -> str:
    """A posterior heatmap in one sentence: which source leads on how many tokens (plain text)."""
    name = VARIANT_NAMES.get(variant.variant, variant.variant)
    leaders = leading_sources(variant)
    if not leaders:
        return f"Heatmap of {name}'s posterior: the answer has no tokens."
    return (f"Heatmap of {name}'s posterior over the sources for each of its {len(leaders)} answer tokens: "
            f"{_counts_in_words(leaders, passages)} lead.")


def describe_gain(variants: Sequence[VariantResult]) -> str:
    """The retrieval-gain chart in one sentence: each variant's largest gain and its token (plain text)."""
    parts = []
    for v in variants:
        gains = token_gains(v)
        if not gains:
            continue
        best = max(range(len(gains)), key=gains.__getitem__)
        signed = f"{gains[best]:+.1f}".replace("-", "−")
        parts.append(f"{VARIANT_NAMES.get(v.variant, v.variant)} gains most on “{token_label(v.tokens[best])}”, "
                     f"{signed} nats")
    if not parts:
        return "Line chart of the retrieval gain per answer token: no tokens."
    return f"Line chart of the retrieval gain per answer token: {'; '.join(parts)}."


def describe_index_reports(reports: Sequence[IndexReport]) -> str:
    """The index comparison's three panels in one sentence (plain text)."""
    if not reports:
        return "Bar charts of the index variants: none measured."
    parts = ", ".join(f"{r.kind} recall {r.recall_at_k:.3f} at {r.query_ms:.3g} ms" for r in reports)
    return f"Bar charts of recall against flat, query latency and memory for {len(reports)} index variants: {parts}."


def memory_leads(result: AskResult) -> bool:
    """Whether p(∅|x) is larger than every passage's p(z|x): no passage matches as well as memory does."""
    return result.memory_prob is not None and result.memory_prob > max((p.prob for p in result.passages), default=0.0)


def memory_row(passages: Sequence[RetrievedPassage]) -> int:
    """Where the charts draw ∅: one row below the last passage's rank."""
    return max((p.rank for p in passages), default=0) + 1


def passage_label(passage: RetrievedPassage, width: int = 24) -> str:
    """'#rank name' for axes, escaped for plotly."""
    return html.escape(f"#{passage.rank} {shorten(passage_name(passage.title, passage.text), width)}")


# How much shorter a passage's name is on a chart's axis when "Large text" is on: the same width in pixels then
# holds fewer letters, and the full ones left a narrow column a sliver of bar (the page's script swaps them)
LARGE_LABEL_SHARE = 0.6


def _large_text_labels(fig, labels: list[str], short: list[str]) -> None:
    """Keep both sets of the y axis's labels in the figure's meta, for the page's script (`ui.scripts`)."""
    fig.update_layout(meta=dict(ticktext=labels, large_ticktext=short))


def _layout(fig, *, title: str, height: int) -> None:
    fig.update_layout(
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=15)),
        height=height,
        margin=dict(l=10, r=10, t=48, b=10),
        font=FONT,
        paper_bgcolor="white",  # white cards stay legible in gradio's dark mode too
        plot_bgcolor="white",
    )


def logit_formula(result: AskResult | RetrieverRanking) -> str:
    """The softmax's input as a formula: "20·score" (dense), "0.2·bm25" (bm25) or "20·score + 0.2·bm25" (hybrid)."""
    if result.retriever == "hybrid":
        return f"{result.scale:g}·score + {result.lexical_weight:g}·bm25"
    if result.retriever == "bm25":
        return f"{result.scale:g}·bm25"
    return f"{result.scale:g}·score"


def doc_prob_figure(result: AskResult, *, height: int = 300):
    """Horizontal bars of the retriever's p(z|x) over the top-k passages (rank 1 on top), and p(∅|x)
    in a bar of its own below them when memory is a source."""
    import plotly.graph_objects as go

    passages = result.passages
    ranks = [p.rank for p in passages]
    fig = go.Figure(
        go.Bar(
            x=[p.prob for p in passages],
            y=ranks,
            orientation="h",
            name="passages",
            marker_color=[passage_color(r) for r in ranks],
            text=[f"{p.prob:.2f}" for p in passages],
            textposition="outside",
            cliponaxis=False,
            customdata=[[html.escape(shorten(passage_name(p.title, p.text), 60)), p.score, p.logit, p.lexical]
                        for p in passages],
            hovertemplate="%{customdata[0]}<br>p(z|x) = %{x:.3f}"
            + ("<br>bm25 = %{customdata[3]:.2f}" if result.retriever == "bm25" else "<br>score = %{customdata[1]:.3f}")
            + ("<br>bm25 = %{customdata[3]:.2f}" if result.retriever == "hybrid" else "")
            + "<br>logit = %{customdata[2]:.2f}<extra></extra>",
        )
    )
    ticks, labels = list(ranks), [passage_label(p, 18) for p in passages]
    short = [passage_label(p, round(18 * LARGE_LABEL_SHARE)) for p in passages]
    title = f"p(z|x) over the top {len(passages)}<br>= softmax({logit_formula(result)})"
    if result.memory_prob is not None:
        row = memory_row(passages)
        fig.add_trace(go.Bar(
            x=[result.memory_prob], y=[row], orientation="h", name=MEMORY_NAME, marker_color=MEMORY_COLOR,
            text=[f"{result.memory_prob:.2f}"], textposition="outside", cliponaxis=False,
            hovertemplate=f"{MEMORY_NAME}: {MEMORY_WHAT}<br>p(∅|x) = %{{x:.3f}}<br>logit θ = {result.memory_logit:.2f}"
                          "<extra></extra>",
        ))
        ticks.append(row)
        labels.append(MEMORY_NAME)
        short.append(MEMORY_NAME)
        title = (f"p(z|x) over the top {len(passages)} and ∅<br>= softmax({logit_formula(result)},<br>"
                 f"and θ = {result.memory_logit:.2f} for ∅)")
    # overlay: grouped bars would leave each trace half a row, empty where the other trace has its bars
    fig.update_layout(barmode="overlay", showlegend=False)
    # no axis title: the labels name the passages, and a title beside them ran into them in a narrow column
    fig.update_yaxes(tickvals=ticks, ticktext=labels, autorange="reversed")
    _large_text_labels(fig, labels, short)
    fig.update_xaxes(title_text="p(z|x)", range=[0, 1.0], gridcolor="rgba(128,128,128,0.2)")
    # short lines: one long line ran past the chart's right edge in a half-width column, and on a phone
    _layout(fig, title=title, height=max(height, 110 + 26 * len(ticks)))
    fig.update_layout(margin=dict(l=10, r=36, t=48 + 20 * title.count("<br>"), b=10))
    return fig


def posterior_heatmap(variant: VariantResult, passages: Sequence[RetrievedPassage], *, height: int = 320):
    """Sources × tokens heatmap of the document posterior (paper Figure 2): the passages, then ∅ memory
    in a row of its own when it is a source (each column then sums to 1 over K + 1 rows).

    RAG-Token: p(z | x, y_i, y<i) ∝ p(z|x) p(y_i|x,z,y<i). RAG-Sequence: the running posterior
    p(z | x, y<=i). `variant.posteriors` is (T, K) and `memory_posteriors` (T,); the figure shows
    their transpose, rows = sources.
    """
    import plotly.graph_objects as go

    num_tokens = len(variant.tokens)
    ranks = [p.rank for p in passages]
    z = [[variant.posteriors[t][j] for t in range(num_tokens)] for j in range(len(passages))]  # (K, T)
    doc_p = [[math.exp(variant.doc_token_logprobs[t][j]) for t in range(num_tokens)] for j in range(len(passages))]
    tokens = [html.escape(token_label(t)) for t in variant.tokens]
    # the passage's rank goes in by hand: with tick labels set, plotly's %{y} shows the label, not the rank
    names = [f"#{p.rank} " + html.escape(shorten(passage_name(p.title, p.text), 40)) for p in passages]
    rows, labels = list(ranks), [passage_label(p, 14) for p in passages]
    short = [passage_label(p, round(14 * LARGE_LABEL_SHARE)) for p in passages]
    if variant.memory_posteriors:
        z.append(list(variant.memory_posteriors))
        doc_p.append([math.exp(lp) for lp in variant.closed_book_token_logprobs])  # ∅'s own: closed-book
        names.append(f"{MEMORY_NAME}: {MEMORY_WHAT}")
        rows.append(memory_row(passages))
        labels.append(MEMORY_NAME)
        short.append(MEMORY_NAME)
    custom = [[[tokens[t], name, doc_p[j][t]] for t in range(num_tokens)] for j, name in enumerate(names)]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(num_tokens)),
            y=rows,
            zmin=0.0,
            zmax=1.0,
            colorscale="Blues",
            # across the top, under the title: beside the cells it took a fifth of a phone's width from them
            colorbar=dict(title=dict(text="posterior", side="right"), orientation="h", thickness=10,
                          lenmode="pixels", len=170, x=1, xanchor="right", y=1.0, yanchor="bottom", tickvals=[0, 0.5, 1]),
            # numbers in the cells only where a phone's cells still hold them (about 30 px at 6 tokens)
            texttemplate="%{z:.2f}" if num_tokens <= 6 and len(rows) <= 11 else None,
            textfont=dict(size=13),
            customdata=custom,
            hovertemplate="token “%{customdata[0]}”<br>%{customdata[1]}<br>posterior = %{z:.3f}"
            "<br>p(token | x, z, prefix) = %{customdata[2]:.3f}<extra></extra>",
            xgap=1,
            ygap=1,
        )
    )
    # no tickangle: plotly's own choice sets the tokens level where they fit and turns them where they would overlap
    # (a long answer on a phone). No axis title either: in the page's plotly it sat on the row of level tokens; the
    # chart's title names the axis
    fig.update_xaxes(tickvals=list(range(num_tokens)), ticktext=tokens)
    # no axis title: the rows name themselves ("#1 Mona Lisa", "∅ memory"), and a phone needs the width
    fig.update_yaxes(tickvals=rows, ticktext=labels, autorange="reversed")
    _large_text_labels(fig, labels, short)
    # y≤i says the posterior runs over the tokens so far; a word for it made the title too long for a phone
    if variant.variant == "token":
        title = "RAG-Token: p(z | x, yᵢ, y&lt;i)"
    else:
        title = "RAG-Sequence: p(z | x, y≤i)"
    _layout(fig, title=title, height=max(height, 160 + 28 * len(rows)))
    fig.update_layout(title_subtitle=dict(text="a column for each answer token", font_size=12),
                      margin=dict(l=10, r=10, t=100, b=10))
    return fig


def token_gains(variant: VariantResult) -> list[float]:
    """(T,) each token's retrieval gain: log p(y_i | x, sources, y<i) − log p(y_i | x, y<i) closed-book.

    >>> v = VariantResult("token", "a", ("a",), (1,), -0.5, (-0.5,), ((-0.5,),), ((1.0,),), (-2.0,))
    >>> token_gains(v)
    [1.5]
    """
    return [a - b for a, b in zip(variant.token_logprobs, variant.closed_book_token_logprobs)]


def same_tokens(variants: Sequence[VariantResult]) -> bool:
    """Whether every variant wrote the same tokens, so that one token axis labels them all."""
    return all(v.tokens == variants[0].tokens for v in variants[1:])


def _gain_trace(v: VariantResult, **axes):
    import plotly.graph_objects as go

    labels = [html.escape(token_label(t)) for t in v.tokens]
    gains = token_gains(v)
    return go.Scatter(
        x=list(range(1, len(gains) + 1)),
        y=gains,
        mode="lines+markers",
        name=VARIANT_NAMES.get(v.variant, v.variant),
        # dashed and hollow for RAG-Sequence: when both variants give the same answer the lines coincide
        line=dict(color=VARIANT_COLORS.get(v.variant, "#444"), width=2, dash="dash" if v.variant == "sequence" else "solid"),
        marker=dict(size=8 if v.variant == "sequence" else 10,
                    symbol="circle-open" if v.variant == "sequence" else "circle"),
        customdata=[[lab, math.exp(a), math.exp(b)] for lab, a, b in
                    zip(labels, v.token_logprobs, v.closed_book_token_logprobs)],
        hovertemplate="“%{customdata[0]}”: %{y:+.2f} nats<br>with passages p = %{customdata[1]:.3f}"
        "<br>closed-book p = %{customdata[2]:.3f}<extra>%{fullData.name}</extra>",
        **axes,
    )


def retrieval_gain_figure(variants: Sequence[VariantResult], *, height: int = 300):
    """Per token, log p(y_i|x,y<i) minus the closed-book log p(y_i|x,y<i): how much the passages helped.

    Positive: the retrieved passages made the token more likely than the generator alone did. When the
    variants wrote different tokens, each gets a panel of its own with its own tokens on the axis: the
    i-th token of one answer has nothing to do with the i-th of another ("Kem" against "Shakespeare").
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    variants = list(variants)
    title = "Retrieval gain per token"
    if len(variants) < 2 or same_tokens(variants):
        fig = go.Figure([_gain_trace(v) for v in variants])
        panels = variants[:1]
    else:
        names = [f"{VARIANT_NAMES.get(v.variant, v.variant)}: “{html.escape(shorten(v.answer, 32))}”" for v in variants]
        fig = make_subplots(rows=len(variants), cols=1, shared_yaxes=True, vertical_spacing=0.44 / len(variants),
                            subplot_titles=names)
        fig.update_annotations(x=0.0, xanchor="left", font_size=13)  # from the left edge: a phone cuts the end only
        for row, v in enumerate(variants, start=1):
            fig.add_trace(_gain_trace(v), row=row, col=1)
        panels = variants
        height = max(height, 60 + 190 * len(variants))
    for row, v in enumerate(panels, start=1):
        ticks = list(range(1, len(v.tokens) + 1))
        fig.update_xaxes(tickvals=ticks, ticktext=[html.escape(token_label(t)) for t in v.tokens],
                         title_text="answer token" if row == len(panels) else None,
                         gridcolor="rgba(128,128,128,0.2)", row=row if len(panels) > 1 else None,
                         col=1 if len(panels) > 1 else None)
        # exponentformat "none": plotly's default wrote a tiny gain as "−500μ", a unit prefix nats do not take
        fig.update_yaxes(title_text="Δ log p (nats)", zeroline=False, gridcolor="rgba(128,128,128,0.2)",
                         exponentformat="none", row=row if len(panels) > 1 else None,
                         col=1 if len(panels) > 1 else None)
    fig.add_hline(y=0, line=dict(color="rgba(128,128,128,0.7)", dash="dot"))
    _layout(fig, title=title, height=height)
    # the formula on a line of its own under the title, and the key to the lines under both: a phone holds each
    formula = "log p(yᵢ) with passages − closed-book"  # short enough for a phone with large text
    if len(panels) > 1:  # each panel names its variant and answer
        subtitle = formula
    else:
        # the lines' key as a line of text under the formula: a legend wraps its second name up into the formula
        # where the plot is narrow (a phone with large text)
        key = "   ".join(f'<span style="color:{VARIANT_COLORS.get(v.variant, "#444")}">'
                         f'{"○ - -" if v.variant == "sequence" else "●—"} {VARIANT_NAMES.get(v.variant, v.variant)}</span>'
                         for v in variants)
        subtitle = f"{formula}<br>{key}" if key else formula
    fig.update_layout(title_subtitle=dict(text=subtitle, font_size=12), showlegend=False,
                      margin=dict(l=10, r=10, t=104 if len(panels) > 1 or not variants else 112, b=10))
    return fig


def megabytes(num_bytes: float) -> str:
    """An index's size in MB to three significant digits, never in exponent form, as the chart and the table show it.

    >>> megabytes(2_163_000), megabytes(18_930_000), megabytes(7_680_000_000), megabytes(0)
    ('2.16', '18.9', '7,680', '0')
    """
    mb = num_bytes / 1e6
    if mb <= 0:
        return "0"
    return f"{mb:,.{max(0, 2 - math.floor(math.log10(mb)))}f}"


def index_report_figure(reports: Sequence[IndexReport], *, height: int | None = None):
    """Three panels comparing the index variants, one above another: recall@k against flat, query latency and
    memory, each a row of horizontal bars."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    kinds = [html.escape(r.kind) for r in reports]
    colors = [("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1")[i % 4] for i in range(len(reports))]
    k = reports[0].recall_k if reports else 0
    # stacked panels of horizontal bars: side by side on a phone, each panel was a third of 390 px and plotly shrank
    # the bars' numbers to about 6 px to fit them over bars that narrow
    fig = make_subplots(rows=3, cols=1, subplot_titles=(f"recall@{k} vs flat", "ms per query", "memory (MB)"),
                        vertical_spacing=0.16)
    fig.update_annotations(font_size=13, x=0.0, xanchor="left")
    # each panel's bar lengths and the numbers written after them: recall to three places, as the table (0.999 is
    # not 1.00), and memory as the table writes it
    panels = (
        ([r.recall_at_k for r in reports], [f"{r.recall_at_k:.3f}" for r in reports]),
        ([r.query_ms for r in reports], [f"{r.query_ms:.3g}" for r in reports]),
        ([r.bytes / 1e6 for r in reports], [megabytes(r.bytes) for r in reports]),
    )
    for row, (values, texts) in enumerate(panels, start=1):
        fig.add_trace(go.Bar(y=kinds, x=values, orientation="h", marker_color=colors, text=texts,
                             textposition="outside", showlegend=False, cliponaxis=False),
                      row=row, col=1)
        # room after the longest bar for its number; no tick labels, since each bar carries its number
        fig.update_xaxes(range=[0, 1.5 * max(values, default=0.0) or 1.0], showticklabels=False, showgrid=False,
                         row=row, col=1)
        fig.update_yaxes(autorange="reversed", row=row, col=1)  # flat on top, in the table's order
    fig.update_xaxes(range=[0, 1.5], row=1, col=1)
    _layout(fig, title="Index variants compared", height=height or 130 + 78 * max(len(reports), 1))
    fig.update_layout(margin=dict(l=10, r=10, t=60, b=10))
    return fig
