"""The page's code that runs in the browser, as gradio takes it (a launch script, events' `js=`): accessible
names, charts drawn larger for "Large text", the long-question notice, copying a link, the stale-answer mark and
scrolling the results into view on a narrow screen. Strings and string builders only; gradio is not imported.
"""

from __future__ import annotations

import json

from .inputs import TAB_ALIASES, link_tab

NARROW_SCREEN = "(max-width: 980px)"  # below this the sidebar column stacks above the results

# How much larger "Large text" draws the charts: the page's text grows by its CSS (assets/style.css, .rag-large)
LARGE_CHART_SCALE = 1.3
# A chart narrower than this (a phone's) takes the shorter passage names when "Large text" is on
NARROW_CHART_PX = 480

# Plotly draws its text at sizes of the figure's own, which the page's CSS cannot reach: with "Large text" on,
# every font size a chart names, its height and its top margin (the title's room) are redrawn LARGE_CHART_SCALE
# times larger. A chart remembers the scale it was drawn at with the layout it was drawn from, so a new
# answer's chart (a new layout) is scaled once and a scaled one is not scaled again.
SCALE_CHARTS_JS = """window.ragScaleCharts = () => {
  if (!window.Plotly) return;
  const want = document.documentElement.classList.contains('rag-large') ? %(scale)s : 1;
  document.querySelectorAll('.js-plotly-plot').forEach((chart) => {
    const layout = chart.layout;
    if (!layout || !Array.isArray(chart.data)) return;
    const drawnAt = chart.ragScaledLayout === layout ? chart.ragScale : 1;
    // shorter passage names on the axis while large on a narrow chart (plots.LARGE_LABEL_SHARE), the figure's own
    // otherwise: a wide chart has room for them
    const meta = layout.meta || {};
    const labels = !Array.isArray(meta.large_ticktext) ? null
      : (want > 1 && ((chart._fullLayout || {}).width || 0) < %(narrow)s ? meta.large_ticktext : meta.ticktext);
    const relabel = labels !== null && (chart.ragScaledLayout === layout ? chart.ragLabels : meta.ticktext) !== labels;
    if (drawnAt === want) {
      chart.ragScaledLayout = layout;
      chart.ragScale = want;
      chart.ragLabels = labels;
      if (relabel) window.Plotly.relayout(chart, {'yaxis.ticktext': labels});
      return;
    }
    const by = want / drawnAt;
    const update = {};
    const grow = (path, value) => { if (typeof value === 'number') update[path] = value * by; };
    const title = layout.title || {};
    grow('font.size', (layout.font || {}).size);
    grow('title.font.size', (title.font || {}).size);
    grow('title.subtitle.font.size', ((title.subtitle || {}).font || {}).size);
    grow('height', (chart._fullLayout || {}).height);  // gradio's chart drops the figure's height once drawn
    // a new height turns plotly's autosize off and pins the width drawn: kept on, so the width follows the page
    if ('height' in update) { update.autosize = true; update.width = null; }
    grow('margin.t', (layout.margin || {}).t);
    grow('margin.r', (layout.margin || {}).r);  // a bar's value label outside it
    (layout.annotations || []).forEach((note, i) => grow(`annotations[${i}].font.size`, (note.font || {}).size));
    if (labels !== null) update['yaxis.ticktext'] = labels;
    const traces = [], sizes = [];
    chart.data.forEach((trace, i) => {
      const size = (trace.textfont || {}).size;
      if (typeof size === 'number') { traces.push(i); sizes.push(size * by); }
    });
    // a heatmap's short colour bar keeps its tick labels at the chart's first size: larger, they turn sideways
    const bars = chart.data.map((trace, i) => (trace.type === 'heatmap' ? i : -1)).filter((i) => i >= 0);
    const base = ((layout.font || {}).size || 12) / drawnAt;
    chart.ragScaledLayout = layout;
    chart.ragScale = want;
    chart.ragLabels = labels;
    if (traces.length) window.Plotly.restyle(chart, {'textfont.size': sizes}, traces);
    if (bars.length) window.Plotly.restyle(chart, {'colorbar.tickfont.size': base}, bars);
    window.Plotly.relayout(chart, update);
  });
};
""" % {"scale": LARGE_CHART_SCALE, "narrow": NARROW_CHART_PX}

# The page's script: it adds the accessible names gradio leaves out (a radio group's name is its label, and a
# chart's is the one sentence the page's action puts in its hidden label, not the numbers of its axes) and
# scales a chart drawn while "Large text" is on. Run at load and after every change of the page, since gradio
# renders components and charts as they come.
LOAD_JS = """() => {
  """ + SCALE_CHARTS_JS + """
  const name = () => {
    document.querySelectorAll('fieldset').forEach((group) => {
      const info = group.querySelector('[data-testid="block-info"]');
      if (!info) return;
      const label = info.textContent.trim();
      if (label && group.getAttribute('aria-label') !== label) group.setAttribute('aria-label', label);
      if (group.querySelector('input[type=radio]') && group.getAttribute('role') !== 'radiogroup') {
        group.setAttribute('role', 'radiogroup');
      }
    });
    document.querySelectorAll('.js-plotly-plot').forEach((plot) => {
      const block = plot.closest('.block');
      const label = block && block.querySelector('[data-testid="block-label"]');
      const text = label ? label.textContent.trim() : '';
      if (block && text && block.getAttribute('aria-label') !== text) {
        block.setAttribute('role', 'figure');
        block.setAttribute('aria-label', text);
      }
      plot.querySelectorAll('svg.main-svg').forEach((svg) => {
        if (svg.getAttribute('aria-hidden') !== 'true') svg.setAttribute('aria-hidden', 'true');
      });
    });
  };
  // a chart keeps the width it was drawn at: one drawn in a hidden tab, or before the window narrowed (a phone
  // turned, a projector's window resized), ran past its box. Each chart is redrawn to its box's new width.
  const fit = new ResizeObserver((entries) => entries.forEach((entry) => {
    const chart = entry.target, width = entry.contentRect.width, drawn = (chart._fullLayout || {}).width;
    if (window.Plotly && width > 0 && drawn && Math.abs(drawn - width) > 1) window.Plotly.Plots.resize(chart);
  }));
  const watched = new WeakSet();
  const watch = () => document.querySelectorAll('.js-plotly-plot').forEach((chart) => {
    if (!watched.has(chart)) { watched.add(chart); fit.observe(chart); }
  });
  name();
  watch();
  let queued = false;
  new MutationObserver(() => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; name(); watch(); window.ragScaleCharts(); });
  }).observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


# Every control of the Ask tab's sidebar is a Tab stop (each radio option, example, slider and its number box), so a
# keyboard reaches the answer after some thirty of them. The sidebar's link, in sight only while it has the focus,
# moves the focus to the answer's first token, or to the message box while there is no answer yet.
SKIP_TO_ANSWER_HTML = '<a class="rag-skip" href="#answer">Skip to the answer</a>'
SKIP_TO_ANSWER_JS = """element.querySelector('a.rag-skip').addEventListener('click', (event) => {
  event.preventDefault();
  const token = document.querySelector('#answer .rag-tok');
  const target = token || document.getElementById('ask-status');
  if (!target) return;
  if (!token) target.setAttribute('tabindex', '-1');
  target.focus();
  target.scrollIntoView({block: 'nearest'});
});"""


LONG_QUESTION_MARK = "rag-long-question"


def long_question_js(limit: int, refused_over: int) -> str:
    """Browser code for a question box's change: in its message box, a notice at once when the text is longer
    than the engine reads (`limit`), or longer than it accepts at all (`refused_over`); when it no longer is, the
    notice goes and any other message stays."""
    return (f"(text, shown) => {{ const n = (text || '').length; if (n <= {limit}) "
            f"return (shown || '').includes('{LONG_QUESTION_MARK}') ? '' : shown; "
            f"const said = n > {refused_over} ? 'the limit is {refused_over:,}: shorten it to ask' "
            f": 'only the last {limit:,} are read'; "
            f"return '<div class=\"rag-status rag-status-info {LONG_QUESTION_MARK}\" role=\"status\">This question has ' + "
            f"n.toLocaleString('en') + ' characters: ' + said + '.</div>'; }}")


# The link's query comes from the page's action (DemoActions.share_link); the page's own address goes before
# it here, where it is known (behind a proxy the server does not know it). The address bar shows it too.
COPY_LINK_JS = """(query) => {
  if (!query) return query;
  const url = window.location.origin + window.location.pathname + query;
  try { window.history.replaceState(null, '', url); } catch (err) {}
  if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(url).catch(() => {});
  return url;
}"""

LARGE_TEXT_JS = ("(on) => { document.documentElement.classList.toggle('rag-large', Boolean(on)); "
                 "if (window.ragScaleCharts) window.ragScaleCharts(); return on; }")
# An answer on screen was asked with the options it was asked with: once a visitor changes one, the answer is
# marked as asked before the change (assets/style.css, .rag-ask-stale) until the next ask. The options are
# compared by value with those on screen when the answer came (`REMEMBER_ANSWER_OPTIONS_JS`): a dropdown opened
# and closed without a choice, or an option set back, leaves the answer as it is.
REMEMBER_ANSWER_OPTIONS_JS = "(...options) => { window.ragAnsweredWith = JSON.stringify(options); return []; }"
MARK_ANSWER_STALE_JS = ("(...options) => { const answer = document.getElementById('answer'); "
                        "if (!answer || !answer.querySelector('.rag-answer-block')) return []; "
                        "if (window.ragAnsweredWith === undefined || JSON.stringify(options) !== window.ragAnsweredWith) "
                        "document.documentElement.classList.add('rag-ask-stale'); "
                        "else document.documentElement.classList.remove('rag-ask-stale'); return []; }")
# an empty question asks nothing: the answer on screen stays the old options' one
CLEAR_ANSWER_STALE_JS = ("(question) => { if (question === undefined || String(question).trim()) "
                         "document.documentElement.classList.remove('rag-ask-stale'); return []; }")


def scroll_into_view_js(elem_id: str) -> str:
    """Browser code for an event: on a narrow screen, scroll the element with this id into view."""
    return (f"() => {{ if (window.matchMedia({json.dumps(NARROW_SCREEN)}).matches) {{ "
            f"const el = document.getElementById({json.dumps(elem_id)}); "
            "if (el) el.scrollIntoView({behavior: 'smooth', block: 'start'}); } }")


def scroll_if_linked_js(elem_id: str, *, swap: bool) -> str:
    """`scroll_into_view_js` for the answer to a link's question (`?q=`), asked on load: on the Swap tab when the
    link names it (`swap`), on the Ask tab otherwise; nothing for a page opened without a question."""
    swap_names = json.dumps(sorted(name for name in {"swap", *TAB_ALIASES} if link_tab(name) == "swap"))
    return ("() => { const link = new URLSearchParams(window.location.search); "
            "const tab = (link.get('tab') || '').trim().toLowerCase().split(/[\\s_]+/).join('-'); "
            f"if (!(link.get('q') || '').trim() || {swap_names}.includes(tab) !== {json.dumps(swap)}) return; "
            f"({scroll_into_view_js(elem_id)})(); }}")
