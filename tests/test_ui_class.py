"""The page as a class uses it, without a browser: links that ask, the answer's downloads, the gain chart
and the words when the two variants disagree, the notes a visitor reads (language, build times, "↵").

As in test_ui.py, the callbacks run on `ui_engine` (tiny random models) and what they return is compared
with what the engine computes for the same inputs, or with a hand-worked case.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qsl, urlsplit

import pytest

from rag_demo import plots
from rag_demo.config import INDEX_KINDS
from rag_demo.results import AskResult, IndexReport, RetrievedPassage, VariantResult
from rag_demo.ui.actions import PRIVATE_KB, DemoActions, Held
from rag_demo.ui.exports import posterior_csv, write_exports
from rag_demo.ui.html import (
    LINE_BREAK_NOTE,
    SCORED_LINE_BREAK_NOTE,
    SPACE_TOKEN_NOTE,
    disagreement_sentence,
    format_answer_html,
    format_score_html,
    format_token_spans,
)
from rag_demo.ui.index_table import BUILT_EARLIER_NOTE, MEASURED_ONCE_NOTE, format_index_table
from rag_demo.question_kinds import LANGUAGE_NOTE, looks_english
from rag_demo.ui.inputs import PageLink, link_query, parse_link
from tests.ui_engine import KB_NAMES, QUESTIONS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture()
def actions(ui_engine, tmp_path):
    from rag_demo.ui.inputs import SessionFiles

    return DemoActions(ui_engine, files=SessionFiles(tmp_path / "sessions"))


def page_ask(actions, question: str, *, variant: str = "both", kb: str = KB_NAMES[0], k: int = 5):
    """The Ask tab's event with the page's defaults."""
    return actions.ask(question, variant, k, "flat", kb, 1, "thorough", None, None, False, True)


def passage(rank: int) -> RetrievedPassage:
    return RetrievedPassage(rank=rank, id=rank - 1, title=f"P{rank}", text="text", score=0.5, prob=0.5, logit=0.5)


def variant_of(name: str, tokens: tuple[str, ...], posteriors, *, answer: str | None = None) -> VariantResult:
    """A hand-made variant over two passages: each token p 0.5 with passages, 0.25 closed-book."""
    n = len(tokens)
    return VariantResult(name, answer if answer is not None else "".join(tokens).strip(), tokens, tuple(range(n)),
                         -0.69 * n, (-0.69,) * n, ((-0.69, -0.69),) * n, tuple(posteriors), (-1.39,) * n)


def figure_disagreement() -> AskResult:
    """The paper's Figure 2 case in miniature: RAG-Token takes "William" from passage #1 and "Kem" from #2;
    RAG-Sequence reads #1 throughout and says "William Shakespeare"."""
    token = variant_of("token", (" William", " Kem", "pe"), [(0.9, 0.1), (0.2, 0.8), (0.3, 0.7)])
    sequence = variant_of("sequence", (" William", " Shakespeare"), [(0.8, 0.2), (0.9, 0.1)])
    return AskResult(question="who wrote hamlet?", kb="wiki", index="flat", k=2, passages=(passage(1), passage(2)),
                     variants={"token": token, "sequence": sequence}, closed_book=None, timings_ms={}, scale=1.0)


# ---- links ----------------------------------------------------------------------------------------


def test_a_link_made_by_copy_link_reads_back_as_the_same_question_and_options(ui_engine):
    query = DemoActions.share_link("who wrote hamlet? & more", "token", KB_NAMES[1], 7.0, "hnsw", "bm25", False)
    params = dict(parse_qsl(urlsplit(query).query))
    assert params == {"tab": "ask", "q": "who wrote hamlet? & more", "kb": KB_NAMES[1], "variant": "token", "k": "7",
                      "index": "hnsw", "retriever": "bm25", "memory": "false"}
    link = parse_link(params, kb_names=KB_NAMES, index_kinds=INDEX_KINDS, retrievers=("dense", "bm25"))
    assert link == PageLink(question="who wrote hamlet? & more", tab="ask", kb=KB_NAMES[1], variant="token", k=7,
                            index="hnsw", retriever="bm25", memory=False)
    # a visitor's own passages live in their tab only: a link never names them
    assert "kb=" not in DemoActions.share_link("q", "both", PRIVATE_KB, 5, "flat", "dense", True)
    swap = dict(parse_qsl(urlsplit(DemoActions.share_swap_link("q", KB_NAMES[1], KB_NAMES[0], "token", 3)).query))
    assert swap == {"tab": "swap", "q": "q", "left": KB_NAMES[1], "right": KB_NAMES[0], "variant": "token", "k": "3"}


def test_a_link_opens_every_tab_of_the_page_by_its_id_or_its_label(ui_engine):
    import gradio as gr

    from rag_demo.ui import build_demo
    from rag_demo.ui.inputs import LINK_TABS, TAB_LABELS

    tabs = {block.id: block.label for block in build_demo(ui_engine).blocks.values() if isinstance(block, gr.Tab)}
    assert set(tabs) == set(LINK_TABS) == set(TAB_LABELS)
    for tab, label in tabs.items():
        assert TAB_LABELS[tab] == label.lower()
        last_word = label.split()[-1].lower()
        names = (tab, label, label.replace(" ", "-"), label.replace(" ", "_").upper())
        for name in names + ((last_word,) if last_word not in LINK_TABS or last_word == tab else ()):
            link = parse_link({"tab": name}, kb_names=None, index_kinds=(), retrievers=())
            assert link.tab == tab and link.notices == (), name


def test_a_link_with_values_the_page_does_not_offer_keeps_the_rest_and_says_what_it_ignored():
    link = parse_link({"q": "who?", "kb": "../etc", "k": "999", "tab": "nowhere", "memory": "maybe", "left": KB_NAMES[0]},
                      kb_names=KB_NAMES, index_kinds=INDEX_KINDS, retrievers=("dense",))
    assert (link.question, link.kb, link.k, link.tab, link.memory, link.left) == ("who?", None, None, None, None, KB_NAMES[0])
    assert len(link.notices) == 4 and any("'../etc'" in n for n in link.notices)
    assert link.asks == "ask"
    assert parse_link({"tab": "swap", "q": "x"}, kb_names=None, index_kinds=(), retrievers=()).asks == "swap"
    assert parse_link({"tab": "learn"}, kb_names=None, index_kinds=(), retrievers=()).asks is None
    # while the engine starts its names are unknown: a name is kept, to be checked when it is asked
    assert parse_link({"kb": "later"}, kb_names=None, index_kinds=(), retrievers=()).kb == "later"
    assert link_query("ask", "  a   b ") == "?tab=ask&q=a+b"


def test_opening_a_link_sets_the_controls_and_asks_what_it_names(actions, ui_engine):
    request = SimpleNamespace(query_params={"q": QUESTIONS[2], "kb": KB_NAMES[1], "variant": "sequence", "k": "4",
                                            "tab": "learn"})
    view = actions.open_link(request)
    assert (view.question, view.kb, view.variant, view.k) == (QUESTIONS[2], KB_NAMES[1], "sequence", 4)
    assert view.tabs["selected"] == "learn"
    link = view.link
    answered = actions.ask_linked(link, view.question, view.variant, view.k, "flat", view.kb, 1, "thorough", None,
                                  None, False, True)
    result = answered.last.value
    direct = ui_engine.ask(QUESTIONS[2], kb=KB_NAMES[1], k=4, variants=("sequence",))
    assert result.variants["sequence"].tokens == direct.variants["sequence"].tokens and set(result.variants) == {"sequence"}
    assert answered.status == ""  # nothing of this link was ignored
    # what a link asked for and the page does not offer stays said beside its answer
    odd = actions.open_link(SimpleNamespace(query_params={"q": QUESTIONS[2], "index": "zzz"}))
    said = actions.ask_linked(odd.link, QUESTIONS[2], "both", 3, "flat", KB_NAMES[0], 1, "thorough", None, None, False,
                              True)
    assert odd.status == said.status and "The link&#x27;s index &#x27;zzz&#x27; is not one of" in said.status
    assert isinstance(said.last.value.passages, tuple)
    # a Swap link asks the Swap tab, not the Ask tab
    swap_link = actions.open_link(SimpleNamespace(query_params={"q": QUESTIONS[0], "tab": "swap"})).link
    assert all(value == {"__type__": "update"} for value in actions.ask_linked(swap_link, QUESTIONS[0]))
    # no query: nothing changes and nothing is asked
    plain = actions.open_link(SimpleNamespace(query_params={}))
    assert plain.link is None and plain.question == {"__type__": "update"}
    assert all(value == {"__type__": "update"} for value in actions.ask_linked(None, QUESTIONS[0]))


class StartingEngine:
    """`engine` as a starting BackgroundEngine shows it: not ready until `serve()` (or failed)."""

    def __init__(self, engine, *, failed: bool = False):
        self._engine, self.ready, self.failed = engine, False, failed

    def serve(self):
        self.ready = True

    def status_text(self):
        return "Preparing models and indexes: starting."

    def ask(self, *args, **kwargs):
        from rag_demo.serving.interface import not_ready

        if not self.ready:
            raise not_ready(self.status_text(), failed=self.failed)
        return self._engine.ask(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def test_a_link_opened_while_the_engine_starts_waits_for_it_and_answers(ui_engine, tmp_path):
    import threading

    from rag_demo.ui.inputs import SessionFiles

    starting = StartingEngine(ui_engine)
    actions = DemoActions(starting, files=SessionFiles(tmp_path / "sessions"))
    link = actions.open_link(SimpleNamespace(query_params={"q": QUESTIONS[0]})).link
    threading.Timer(0.5, starting.serve).start()
    answered = actions.ask_linked(link, QUESTIONS[0], "token", 3, "flat", KB_NAMES[0], 1, "thorough", None, None,
                                  False, True)
    assert answered.status == "" and answered.last.value.question == QUESTIONS[0]  # answered, not "try again"
    # a visitor's own ask does not wait; a failed start is not waited for
    assert "Try again in a moment" in page_ask(DemoActions(StartingEngine(ui_engine)), QUESTIONS[0]).status
    assert not DemoActions(StartingEngine(ui_engine, failed=True)).wait_until_ready(timeout=60)
    assert not DemoActions(StartingEngine(ui_engine)).wait_until_ready(timeout=0.3)


def test_a_link_opened_while_the_engine_starts_keeps_its_knowledge_bases_when_the_choices_arrive(actions):
    link = Held(PageLink(question="q", kb=KB_NAMES[1], left=KB_NAMES[1], right=KB_NAMES[0]))
    view = actions.poll(0, link)
    assert (view.kb["value"], view.swap_left["value"], view.swap_right["value"]) == (KB_NAMES[1], KB_NAMES[1], KB_NAMES[0])
    assert actions.poll(0).kb["value"] == actions.engine.default_kb


# ---- downloads ------------------------------------------------------------------------------------


def test_the_downloads_hold_the_answers_json_and_each_heatmaps_numbers(actions, tmp_path):
    result = page_ask(actions, QUESTIONS[1]).last.value
    view = actions.exports(Held(result), SimpleNamespace(session_hash="visitor-1"))
    files = {name: value["value"] for name, value in view._asdict().items()}
    assert json.loads(open(files["answer_json"], encoding="utf-8").read()) == json.loads(json.dumps(result.to_json()))
    for name, key in (("token", "token_csv"), ("sequence", "sequence_csv")):
        rows = list(csv.reader(open(files[key], encoding="utf-8")))
        variant = result.variants[name]
        assert rows[0][3:] == [f"{i}:{plots.token_label(t)}" for i, t in enumerate(variant.tokens, start=1)]
        matrix = [[float(x) for x in row[3:]] for row in rows[1:]]  # (K, T), rows = passages by rank
        assert [list(col) for col in zip(*matrix)] == [pytest.approx(r, abs=1e-6) for r in variant.posteriors]
    # the visitor's own folder, replaced by the next answer's files
    assert "visitor-1" in files["answer_json"]
    later = actions.exports(Held(page_ask(actions, QUESTIONS[2]).last.value), SimpleNamespace(session_hash="visitor-1"))
    assert not Path(files["answer_json"]).exists() and Path(later.answer_json["value"]).is_file()
    # no answer yet: no buttons
    assert actions.exports(None, SimpleNamespace(session_hash="v")).answer_json["visible"] is False


def test_the_csv_adds_memorys_row_when_memory_is_a_source(tmp_path):
    token = variant_of("token", ("a", "b"), [(0.5, 0.2), (0.1, 0.3)])
    token = VariantResult(**{**token.__dict__, "memory_posteriors": (0.3, 0.6)})
    result = AskResult(question="q", kb="k", index="flat", k=2, passages=(passage(1), passage(2)),
                       variants={"token": token}, closed_book=None, timings_ms={}, scale=1.0, memory_prob=0.25,
                       memory_logit=13.0)
    rows = list(csv.reader(io.StringIO(posterior_csv(token, result))))
    assert rows == [["source", "title", "p(z|x)", "1:a", "2:b"],
                    ["#1", "P1", "0.500000", "0.500000", "0.100000"],
                    ["#2", "P2", "0.500000", "0.200000", "0.300000"],
                    [plots.MEMORY_NAME, plots.MEMORY_WHAT, "0.250000", "0.300000", "0.600000"]]
    assert {path.name for path in write_exports(result, tmp_path).values()} == {"rag-answer.json", "rag-token-posterior.csv"}


# ---- the gain chart and the words when the variants disagree -----------------------------------


def test_the_gain_chart_gives_each_variant_its_own_token_axis_when_the_answers_differ():
    result = figure_disagreement()
    fig = plots.retrieval_gain_figure(list(result.variants.values()))
    assert list(fig.layout.xaxis.ticktext) == ["William", "Kem", "pe"]
    assert list(fig.layout.xaxis2.ticktext) == ["William", "Shakespeare"]
    assert [trace.xaxis for trace in fig.data] == ["x", "x2"]
    assert [[row[0] for row in trace.customdata] for trace in fig.data] == [["William", "Kem", "pe"], ["William", "Shakespeare"]]
    assert list(fig.data[0].y) == pytest.approx([-0.69 + 1.39] * 3)  # log 0.5 − log 0.25 per token
    # the same answer: one axis, labelled with its tokens, both lines on it
    same = plots.retrieval_gain_figure([result.variants["token"], result.variants["token"]])
    assert list(same.layout.xaxis.ticktext) == ["William", "Kem", "pe"] and "xaxis2" not in same.layout
    assert plots.describe_gain(list(result.variants.values())) == (
        "Line chart of the retrieval gain per answer token: RAG-Token gains most on “William”, +0.7 nats; "
        "RAG-Sequence gains most on “William”, +0.7 nats.")


def test_the_page_says_where_the_variants_disagree_and_where_the_posterior_switches_passage():
    result = figure_disagreement()
    sentence = disagreement_sentence(result)
    assert sentence.startswith("RAG-Token and RAG-Sequence disagree: RAG-Token says “William Kempe”, "
                               "RAG-Sequence “William Shakespeare”.")
    assert "RAG-Token's posterior switches source from passage #1 to passage #2 at “Kem” (token 2)." in sentence
    assert "RAG-Sequence's posterior stays on passage #1 for every token." in sentence
    assert "rag-disagree" in format_answer_html(result)
    agreeing = AskResult(**{**result.__dict__, "variants": {"token": result.variants["token"],
                                                             "sequence": result.variants["token"]}})
    assert disagreement_sentence(agreeing) == "" and "rag-disagree" not in format_answer_html(agreeing)
    # both led by one passage throughout: said once, with what made the difference instead
    token = variant_of("token", (" William", " Kem", "pe"), [(0.9, 0.1), (0.6, 0.4), (0.7, 0.3)])
    same_leader = AskResult(**{**result.__dict__, "variants": {"token": token, "sequence": result.variants["sequence"]}})
    sentence = disagreement_sentence(same_leader)
    assert "Both posteriors stay on passage #1 for every token; the answers still differ because the other sources" in sentence
    assert "stays on" not in sentence


def test_each_answer_token_shows_its_passage_number_beside_its_colour_and_has_a_role():
    result = figure_disagreement()
    spans = format_token_spans(result.variants["token"], result.passages)
    assert spans.count('role="img"') == 3
    # one number per run of tokens from the same passage: "William" from #1, "Kem" "pe" from #2
    assert re.findall(r'rag-tok-src" aria-hidden="true">(.*?)<', spans) == ["#1", "#2"]
    assert [bool(re.search(r'rag-tok-src', token)) for token in spans.split('role="img"')[1:]] == [True, False, True]


def test_the_charts_are_described_in_a_sentence():
    result = figure_disagreement()
    assert plots.describe_heatmap(result.variants["token"], result.passages) == (
        "Heatmap of RAG-Token's posterior over the sources for each of its 3 answer tokens: "
        "passage #2 on 2 tokens, passage #1 on 1 token lead.")
    reports = [IndexReport("flat", 0.01, 1000, 1.0, 10, 0.2), IndexReport("hnsw", 3.0, 2000, 0.95, 10, 0.05)]
    assert plots.describe_index_reports(reports).startswith("Bar charts of recall against flat")


# ---- notes a visitor reads ------------------------------------------------------------------------


def test_a_question_in_another_language_gets_a_note_that_the_models_read_english(actions):
    french = actions.ask("qui a peint la Joconde ?", "both", 3, "flat", KB_NAMES[0], 1, "thorough", None)
    assert LANGUAGE_NOTE.split(":")[0] in french.answer
    english = page_ask(actions, QUESTIONS[0])
    assert LANGUAGE_NOTE.split(":")[0] not in english.answer
    assert not looks_english("Wer hat die Mona Lisa gemalt?") and looks_english("who directed la la land?")


def test_the_index_table_says_which_build_times_were_not_measured_in_that_click():
    reports = [IndexReport("flat", 0.01, 1000, 1.0, 10, 0.2), IndexReport("hnsw", 3.0, 2000, 0.95, 10, 0.05)]
    table = format_index_table(reports, "wiki", click_seconds=0.5)
    assert table.count("<td>3.00<span") == 1 and "<td>0.01</td>" in table
    assert BUILT_EARLIER_NOTE.split(":")[0] in table
    assert "built before this click" not in format_index_table(reports, "wiki", click_seconds=10.0)
    assert MEASURED_ONCE_NOTE in table and MEASURED_ONCE_NOTE in format_index_table(reports, "wiki", click_seconds=10.0)


def test_line_breaks_in_answers_are_explained_where_they_show():
    broken = variant_of("token", (" Paris", "\n\n"), [(0.9, 0.1), (0.5, 0.5)], answer="Paris")
    result = AskResult(question="q", kb="k", index="flat", k=2, passages=(passage(1), passage(2)),
                       variants={"token": broken}, closed_book=None, timings_ms={}, scale=1.0)
    assert "↵↵" in format_answer_html(result) and LINE_BREAK_NOTE.split(".")[0] in format_answer_html(result)
    # a scored answer's line break is the stop scoring adds, not one the generator wrote
    scored = format_score_html(result)
    assert SCORED_LINE_BREAK_NOTE.split(":")[0] in scored and LINE_BREAK_NOTE.split(".")[0] not in scored
    plain = AskResult(**{**result.__dict__, "variants": {"token": variant_of("token", (" Paris",), [(0.9, 0.1)])}})
    assert LINE_BREAK_NOTE.split(".")[0] not in format_answer_html(plain)
    assert SPACE_TOKEN_NOTE.split(":")[0] not in format_answer_html(plain) + format_answer_html(result)
    spaced = AskResult(**{**result.__dict__, "variants": {"token": variant_of("token", (" ", "8"), [(0.9, 0.1), (0.5, 0.5)],
                                                                                answer="8")}})
    assert "␣" in format_answer_html(spaced) and SPACE_TOKEN_NOTE.split(":")[0] in format_answer_html(spaced)
