"""Results -> plotly figures. Pure functions; plotly is imported inside them.

Every label that came from a passage, a question or a token is HTML-escaped first:
plotly renders a small subset of HTML (<b>, <br>, <a href>) in titles, ticks and hovers.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from .results import AskResult, IndexReport, RetrievedPassage, RetrieverRanking, VariantResult

# Colour-blind-friendly qualitative palette (Tableau 10); passage rank r gets PALETTE[(r - 1) % 10].
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
VARIANT_NAMES = {"token": "RAG-Token", "sequence": "RAG-Sequence"}
VARIANT_COLORS = {"token": "#4338ca", "sequence": "#0f766e"}
# The generator's memory ∅ in every chart and card: the closed-book card's grey, since ∅ is that same
# generator reading the question with no passage.
MEMORY_COLOR = "#6b7280"
MEMORY_NAME = "∅ memory"
MEMORY_WHAT = "no passage: the generator's own memory"
FONT = dict(family="ui-sans-serif, system-ui, sans-serif", size=13, color="#1f2937")


def passage_color(rank: int) -> str:
    """The colour of the passage at 1-based `rank`.

    >>> passage_color(1), passage_color(11)
    ('#4e79a7', '#4e79a7')
    """
    return PALETTE[(rank - 1) % len(PALETTE)]


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
    """A token as a short visible label: whitespace made visible, never empty.

    >>> token_label(" Paris"), token_label("\\n"), token_label(" ")
    ('Paris', '↵', '␣')
    """
    shown = token.strip().replace("\n", "↵")
    if shown:
        return shown
    return "↵" if "\n" in token else "␣"


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


def memory_leads(result: AskResult) -> bool:
    """Whether p(∅|x) is larger than every passage's p(z|x): no passage matches as well as memory does."""
    return result.memory_prob is not None and result.memory_prob > max((p.prob for p in result.passages), default=0.0)


def memory_row(passages: Sequence[RetrievedPassage]) -> int:
    """Where the charts draw ∅: one row below the last passage's rank."""
    return max((p.rank for p in passages), default=0) + 1


def passage_label(passage: RetrievedPassage, width: int = 24) -> str:
    """'#rank name' for axes, escaped for plotly."""
    return html.escape(f"#{passage.rank} {shorten(passage_name(passage.title, passage.text), width)}")


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
        title = (f"p(z|x) over the top {len(passages)} and ∅<br>= softmax({logit_formula(result)}; "
                 f"θ = {result.memory_logit:.2f})")
    # overlay: grouped bars would leave each trace half a row, empty where the other trace has its bars
    fig.update_layout(barmode="overlay", showlegend=False)
    fig.update_yaxes(title_text="passage", tickvals=ticks, ticktext=labels, autorange="reversed")
    fig.update_xaxes(title_text="p(z|x)", range=[0, 1.0], gridcolor="rgba(128,128,128,0.2)")
    # two short lines: one long line ran past the chart's right edge in a half-width column
    _layout(fig, title=title, height=max(height, 110 + 26 * len(ticks)))
    fig.update_layout(margin=dict(l=10, r=36, t=68, b=10))
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
    rows, labels = list(ranks), [passage_label(p, 18) for p in passages]
    if variant.memory_posteriors:
        z.append(list(variant.memory_posteriors))
        doc_p.append([math.exp(lp) for lp in variant.closed_book_token_logprobs])  # ∅'s own: closed-book
        names.append(f"{MEMORY_NAME}: {MEMORY_WHAT}")
        rows.append(memory_row(passages))
        labels.append(MEMORY_NAME)
    custom = [[[tokens[t], name, doc_p[j][t]] for t in range(num_tokens)] for j, name in enumerate(names)]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(num_tokens)),
            y=rows,
            zmin=0.0,
            zmax=1.0,
            colorscale="Blues",
            colorbar=dict(title=dict(text="posterior", side="right"), thickness=12, len=0.9),
            texttemplate="%{z:.2f}" if num_tokens <= 10 and len(rows) <= 11 else None,  # legible cells only
            textfont=dict(size=10),
            customdata=custom,
            hovertemplate="token “%{customdata[0]}”<br>%{customdata[1]}<br>posterior = %{z:.3f}"
            "<br>p(token | x, z, prefix) = %{customdata[2]:.3f}<extra></extra>",
            xgap=1,
            ygap=1,
        )
    )
    fig.update_xaxes(title_text="answer token", tickvals=list(range(num_tokens)), ticktext=tokens, tickangle=-30)
    fig.update_yaxes(title_text="passage" if len(rows) == len(passages) else "source", tickvals=rows, ticktext=labels,
                     autorange="reversed")
    if variant.variant == "token":
        title = "RAG-Token: p(z | x, yᵢ, y&lt;i) per token"
    else:
        title = "RAG-Sequence: running p(z | x, y≤i)"
    _layout(fig, title=title, height=max(height, 110 + 28 * len(rows)))
    return fig


def retrieval_gain_figure(variants: Sequence[VariantResult], *, height: int = 280):
    """Per token, log p(y_i|x,y<i) minus the closed-book log p(y_i|x,y<i): how much the passages helped.

    Positive: the retrieved passages made the token more likely than the generator alone did.
    """
    import plotly.graph_objects as go

    fig = go.Figure()
    longest: VariantResult | None = None
    for v in variants:
        gains = [a - b for a, b in zip(v.token_logprobs, v.closed_book_token_logprobs)]
        labels = [html.escape(token_label(t)) for t in v.tokens]
        fig.add_trace(
            go.Scatter(
                x=list(range(1, len(gains) + 1)),
                y=gains,
                mode="lines+markers",
                name=VARIANT_NAMES.get(v.variant, v.variant),
                # dashed and hollow for RAG-Sequence: when both variants give the same answer the lines coincide
                line=dict(color=VARIANT_COLORS.get(v.variant, "#444"), width=2,
                          dash="dash" if v.variant == "sequence" else "solid"),
                marker=dict(size=8 if v.variant == "sequence" else 10,
                            symbol="circle-open" if v.variant == "sequence" else "circle"),
                customdata=[[lab, math.exp(a), math.exp(b)] for lab, a, b in
                            zip(labels, v.token_logprobs, v.closed_book_token_logprobs)],
                hovertemplate="“%{customdata[0]}”: %{y:+.2f} nats<br>with passages p = %{customdata[1]:.3f}"
                "<br>closed-book p = %{customdata[2]:.3f}<extra>%{fullData.name}</extra>",
            )
        )
        if longest is None or len(v.tokens) > len(longest.tokens):
            longest = v
    fig.add_hline(y=0, line=dict(color="rgba(128,128,128,0.7)", dash="dot"))
    if longest is not None:
        ticks = list(range(1, len(longest.tokens) + 1))
        same = all(v.tokens == longest.tokens[: len(v.tokens)] for v in variants)
        text = [html.escape(token_label(t)) for t in longest.tokens] if same else [str(i) for i in ticks]
        fig.update_xaxes(tickvals=ticks, ticktext=text)
    fig.update_xaxes(title_text="answer token", gridcolor="rgba(128,128,128,0.2)")
    fig.update_yaxes(title_text="Δ log p (nats)", zeroline=False, gridcolor="rgba(128,128,128,0.2)")
    _layout(fig, title="Retrieval gain per token: log p(yᵢ | x, passages) − log p(yᵢ | x) closed-book", height=height)
    fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0))
    return fig


def index_report_figure(reports: Sequence[IndexReport], *, height: int = 300):
    """Three panels comparing the index variants: recall@k against flat, query latency and memory."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    kinds = [html.escape(r.kind) for r in reports]
    colors = [("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1")[i % 4] for i in range(len(reports))]
    k = reports[0].recall_k if reports else 0
    fig = make_subplots(rows=1, cols=3, subplot_titles=(f"recall@{k} vs flat", "query latency (ms)", "memory (MB)"),
                        horizontal_spacing=0.1)
    panels = (
        [r.recall_at_k for r in reports],
        [r.query_ms for r in reports],
        [r.bytes / 1e6 for r in reports],
    )
    formats = ("{:.2f}", "{:.3g}", "{:.3g}")
    for col, (values, fmt) in enumerate(zip(panels, formats), start=1):
        fig.add_trace(go.Bar(x=kinds, y=values, marker_color=colors, text=[fmt.format(v) for v in values],
                             textposition="outside", showlegend=False, cliponaxis=False), row=1, col=col)
        fig.update_xaxes(title_text="index", row=1, col=col)
    fig.update_yaxes(title_text="recall", range=[0, 1.15], row=1, col=1)
    fig.update_yaxes(title_text="ms per query", row=1, col=2)
    fig.update_yaxes(title_text="MB", row=1, col=3)
    _layout(fig, title="Index variants on this knowledge base", height=height)
    fig.update_layout(margin=dict(l=10, r=10, t=70, b=10))
    return fig
