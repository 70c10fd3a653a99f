"""A self-contained HTML report of runs: per-stage statistics, one invocation's worker
timeline, a comparison with base runs, and the step time breakdown of outer traces.

Everything is in the one file (no network): the data as JSON in the page, drawn by a small
script into tables and an SVG timeline (a lane per AIC or AIV worker, stages coloured).
The page marks ``<html data-ready="1">`` when it is drawn, and ``data-error`` with the
message if a script failed, so a headless browser can check it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from multicore_profiler.analysis.compare import Comparison
from multicore_profiler.errors import ExportError
from multicore_profiler.export.files import written_aside
from multicore_profiler.storage.selectors import RunSelector
from multicore_profiler.storage.store import Store

_STAGES = """
SELECT kernel_name, stage,
       count(*) FILTER (WHERE phase = 'compute') AS tasks,
       round(quantile_cont(dur_ns, 0.5) FILTER (WHERE phase = 'compute') / 1e3, 2)
           AS compute_p50_us,
       round(quantile_cont(dur_ns, 0.99) FILTER (WHERE phase = 'compute') / 1e3, 2)
           AS compute_p99_us,
       round(sum(dur_ns) FILTER (WHERE phase = 'compute') / 1e3, 1) AS compute_total_us,
       round(quantile_cont(dur_ns, 0.5) FILTER (WHERE phase = 'wait') / 1e3, 2) AS wait_p50_us,
       round(quantile_cont(dur_ns, 0.99) FILTER (WHERE phase = 'wait') / 1e3, 2) AS wait_p99_us
FROM records_ns WHERE list_contains($runs, run_id)
GROUP BY ALL ORDER BY kernel_name, min(stage_desc_id)
"""

_TIMELINE = """
SELECT core, block_id, stage, phase, ts_ns, dur_ns
FROM records_ns
WHERE run_id = $run AND rank = $rank AND invocation_id = $invocation
ORDER BY core, block_id, ts_ns
"""

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mcprof report: __TITLE__</title>
<script>window.addEventListener("error", function (e) {
  document.documentElement.dataset.error = String(e.message);
});</script>
<style>
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
table { border-collapse: collapse; margin: 8px 0 24px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f2f2f2; } td:first-child, td.text { text-align: left; }
tr.regressed td { background: #fde2e2; } tr.improved td { background: #e2f5e6; }
.lane-label { font-size: 11px; fill: #555; } .warning { color: #a15c00; }
</style></head><body>
<h1>mcprof report</h1>
<p id="summary"></p>
<h2>Stages</h2><table id="stages"></table>
<h2>Timeline of one invocation</h2><p id="timeline-title"></p><div id="timeline"></div>
<div id="comparison-section"></div>
<div id="breakdown-section"></div>
<script type="application/json" id="data">__DATA__</script>
<script>
(function () {
  var data = JSON.parse(document.getElementById("data").textContent);
  var SVG = "http://www.w3.org/2000/svg";
  function cell(row, value, cls) {
    var td = document.createElement("td");
    td.textContent = value === null || value === undefined ? "" : String(value);
    if (cls) td.className = cls;
    row.appendChild(td);
  }
  function table(element, columns, rows, classOf) {
    var head = document.createElement("tr");
    columns.forEach(function (c) {
      var th = document.createElement("th"); th.textContent = c; head.appendChild(th);
    });
    element.appendChild(head);
    rows.forEach(function (r) {
      var tr = document.createElement("tr");
      if (classOf) tr.className = classOf(r);
      columns.forEach(function (c) {
        cell(tr, r[c], typeof r[c] === "string" ? "text" : "");
      });
      element.appendChild(tr);
    });
  }
  document.getElementById("summary").textContent = data.summary;
  table(document.getElementById("stages"), data.stages.columns, data.stages.rows);

  var t = data.timeline;
  document.getElementById("timeline-title").textContent = t.title;
  var lanes = [], laneOf = {};
  for (var i = 0; i < t.core.length; i++) {
    var key = t.core[i] + "/" + t.block_id[i];
    if (!(key in laneOf)) { laneOf[key] = lanes.length; lanes.push(key); }
  }
  var start = Math.min.apply(null, t.ts_ns), end = start;
  for (var j = 0; j < t.ts_ns.length; j++) end = Math.max(end, t.ts_ns[j] + t.dur_ns[j]);
  var width = 1100, left = 80, laneHeight = 14;
  var scale = (width - left - 10) / Math.max(end - start, 1);
  var svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", lanes.length * laneHeight + 20);
  lanes.forEach(function (name, index) {
    var g = document.createElementNS(SVG, "g");
    g.setAttribute("class", "lane");
    g.setAttribute("data-lane", name);
    g.setAttribute("transform", "translate(0," + (index * laneHeight) + ")");
    var label = document.createElementNS(SVG, "text");
    label.setAttribute("class", "lane-label"); label.setAttribute("y", 11);
    label.textContent = name;
    g.appendChild(label);
    svg.appendChild(g);
  });
  var groups = svg.querySelectorAll("g.lane");
  for (var k = 0; k < t.core.length; k++) {
    var rect = document.createElementNS(SVG, "rect");
    var phase = t.phase[k];
    rect.setAttribute("x", left + (t.ts_ns[k] - start) * scale);
    rect.setAttribute("y", 1);
    rect.setAttribute("width", Math.max(t.dur_ns[k] * scale, 0.5));
    rect.setAttribute("height", laneHeight - 3);
    rect.setAttribute("fill", phase === "compute" ? data.colors[t.stage[k]] || "#999"
                              : phase === "wait" ? "#ddd" : "#444");
    var tip = document.createElementNS(SVG, "title");
    tip.textContent = t.stage[k] + " " + phase + ": " + (t.dur_ns[k] / 1e3).toFixed(2) + " us";
    rect.appendChild(tip);
    groups[laneOf[t.core[k] + "/" + t.block_id[k]]].appendChild(rect);
  }
  document.getElementById("timeline").appendChild(svg);
  var legend = document.createElement("p"); legend.id = "legend";
  Object.keys(data.colors).concat(["wait", "trigger"]).forEach(function (name) {
    var swatch = document.createElement("span");
    swatch.style.cssText = "display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;"
      + "background:" + (data.colors[name] || (name === "wait" ? "#ddd" : "#444"));
    legend.appendChild(swatch);
    legend.appendChild(document.createTextNode(name));
  });
  document.getElementById("timeline").appendChild(legend);

  if (data.comparison) {
    var section = document.getElementById("comparison-section");
    var title = document.createElement("h2"); title.textContent = "Comparison";
    var text = document.createElement("p"); text.textContent = data.comparison.summary;
    section.appendChild(title); section.appendChild(text);
    data.comparison.warnings.forEach(function (w) {
      var p = document.createElement("p"); p.className = "warning";
      p.textContent = "warning: " + w; section.appendChild(p);
    });
    var compared = document.createElement("table"); compared.id = "comparison";
    table(compared, data.comparison.columns, data.comparison.rows,
          function (r) { return r.verdict; });
    section.appendChild(compared);
  }
  if (data.breakdown) {
    var part = document.getElementById("breakdown-section");
    var heading = document.createElement("h2"); heading.textContent = "Step time breakdown";
    part.appendChild(heading);
    var b = data.breakdown, longest = Math.max.apply(null, b.rows.map(function (r) {
      return r.stage_ns; }).concat([1]));
    var barWidth = 900, barLeft = 260, barHeight = 18;
    var chart = document.createElementNS(SVG, "svg");
    chart.setAttribute("id", "breakdown");
    chart.setAttribute("width", barLeft + barWidth + 10);
    chart.setAttribute("height", b.rows.length * (barHeight + 6) + 6);
    b.rows.forEach(function (r, index) {
      var g = document.createElementNS(SVG, "g");
      g.setAttribute("class", "step");
      g.setAttribute("data-step", r.label);
      g.setAttribute("transform", "translate(0," + (index * (barHeight + 6) + 3) + ")");
      var label = document.createElementNS(SVG, "text");
      label.setAttribute("class", "lane-label"); label.setAttribute("y", 13);
      label.textContent = r.label;
      g.appendChild(label);
      var x = barLeft;
      b.parts.forEach(function (name) {
        var w = r[name] / longest * barWidth;
        var rect = document.createElementNS(SVG, "rect");
        rect.setAttribute("class", "part"); rect.setAttribute("data-part", name);
        rect.setAttribute("x", x); rect.setAttribute("width", w);
        rect.setAttribute("height", barHeight); rect.setAttribute("fill", b.colors[name]);
        var tip = document.createElementNS(SVG, "title");
        tip.textContent = r.label + " " + name + ": " + (r[name] / 1e3).toFixed(1) + " us";
        rect.appendChild(tip);
        g.appendChild(rect);
        x += w;
      });
      chart.appendChild(g);
    });
    part.appendChild(chart);
    var key = document.createElement("p"); key.id = "breakdown-legend";
    b.parts.forEach(function (name) {
      var swatch = document.createElement("span");
      swatch.style.cssText = "display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;"
        + "background:" + b.colors[name];
      key.appendChild(swatch);
      key.appendChild(document.createTextNode(name));
    });
    part.appendChild(key);
  }
  document.documentElement.dataset.ready = "1";
})();
</script></body></html>
"""

_PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")


def _comparison(comparison: Comparison) -> dict[str, Any]:
    rows = comparison.rows
    shown = [
        {
            **{column: row[column] for column in comparison.by},
            "base median (us)": _us(row["base_median_ns"]),
            "head median (us)": _us(row["head_median_ns"]),
            "change": None if row["change"] is None else f"{row['change']:+.1%}",
            "p": None if row["p_value"] is None else f"{row['p_value']:.2g}",
            "verdict": row["verdict"],
            "added (us/invocation)": _us(row["impact_ns"]),
        }
        for row in rows.to_pylist()
    ]
    columns = [*comparison.by, "base median (us)", "head median (us)", "change", "p"]
    return {
        "summary": f"base {comparison.base} against {comparison.head}: {comparison.summary()}",
        "warnings": list(comparison.warnings),
        "columns": [*columns, "verdict", "added (us/invocation)"],
        "rows": shown,
    }


_BREAKDOWN = """
SELECT b.source_id, b.step_index, s.step_name, b.stage_ns, b.computing_ns,
       b.communication_not_overlapped_ns, b.free_ns
FROM step_time_breakdown b JOIN steps s USING (source_id, step_index)
WHERE list_contains($sources, b.source_id)
ORDER BY list_position($sources, b.source_id), b.step_index
"""
_BREAKDOWN_PARTS = {
    "computing_ns": "#4c72b0",
    "communication_not_overlapped_ns": "#c44e52",
    "free_ns": "#cccccc",
}
"""The parts of a step's bar, which tile its stage time as msprof-analyze's do."""


def _breakdown(store: Store, traces: RunSelector | str) -> dict[str, Any]:
    """One bar per step of the selected outer traces: computing, communication not
    overlapped with it, and free time (``step_time_breakdown``)."""
    sources = store.select_traces(traces)
    rows = store.sql(_BREAKDOWN, {"sources": sources}).to_pylist()
    if not rows:
        raise ExportError(f"the traces selected by {traces} have no step to break down")
    for row in rows:
        row["label"] = f"{row['source_id'][:8]} {row['step_name']}"
    return {"parts": list(_BREAKDOWN_PARTS), "colors": _BREAKDOWN_PARTS, "rows": rows}


def _us(value: float | None) -> float | None:
    return None if value is None else round(value / 1e3, 2)


def write_report(
    store: Store,
    runs: RunSelector | str,
    output: Path | str,
    *,
    base: RunSelector | str | None = None,
    invocation: int | None = None,
    traces: RunSelector | str | None = None,
) -> Path:
    """Write the report of the selected runs to ``output``: their stages, the timeline of
    ``invocation`` of the latest run (default: its first), with ``base`` the comparison of
    those runs against the base runs, and with ``traces`` (a selector of outer traces) a
    stacked bar of each of their steps' time breakdown."""
    output = Path(output)
    with written_aside(output, ExportError, "the report") as aside:
        page = _page(store, runs, base, invocation, traces)
        aside.write_text(page, encoding="utf-8")
    return output


_SCRIPT_SAFE = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)
"""JSON escapes of what an HTML parser reads inside a script element (``</script>``,
``<!--`` and ``<script`` change how it ends) and of the line separators old JavaScript
refused in strings. They occur only inside JSON strings, where the escape means the same."""


def script_json(data: Any) -> str:
    """``data`` as JSON text that can stand in a ``<script>`` element as it is."""
    return orjson.dumps(data).decode().translate(_SCRIPT_SAFE)


def _page(
    store: Store,
    runs: RunSelector | str,
    base: RunSelector | str | None,
    invocation: int | None,
    traces: RunSelector | str | None,
) -> str:
    """The report's HTML: the data of the selected runs in the page's script."""
    selected = store.select_runs(runs)
    latest = selected[-1]
    chosen = store.sql(
        """SELECT rank, invocation_id, kernel_name FROM invocations WHERE run_id = $run
           AND ($invocation IS NULL OR invocation_id = $invocation)
           ORDER BY invocation_id, rank LIMIT 1""",
        {"run": latest, "invocation": invocation},
        runs=[latest],
    ).to_pylist()
    if not chosen:
        what = "no invocation" if invocation is None else f"no invocation {invocation}"
        raise ExportError(f"run {latest} has {what} to draw")
    rank, invocation_id, kernel = (chosen[0][k] for k in ("rank", "invocation_id", "kernel_name"))
    stages = store.sql(_STAGES, {"runs": selected}, runs=selected)
    timeline = store.sql(
        _TIMELINE, {"run": latest, "rank": rank, "invocation": invocation_id}, runs=[latest]
    ).to_pydict()
    names = sorted({name for name in timeline["stage"] if name is not None})
    data = {
        "summary": f"{len(selected)} run(s) selected by {runs}: {', '.join(selected)}",
        "stages": {"columns": stages.column_names, "rows": stages.to_pylist()},
        "timeline": {
            "title": f"{kernel}, run {latest}, rank {rank}, invocation {invocation_id}: "
            f"{len(timeline['ts_ns'])} records on AIC and AIV workers",
            **timeline,
        },
        "colors": {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(names)},
        "comparison": None if base is None else _comparison(store.compare(base, runs)),
        "breakdown": None if traces is None else _breakdown(store, traces),
    }
    page = _PAGE.replace("__TITLE__", f"{len(selected)} run(s)")
    return page.replace("__DATA__", script_json(data))
