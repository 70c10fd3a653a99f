"""A self-contained HTML report of runs: per-stage statistics, one invocation's worker
timeline with its critical path, where each of its cores' time goes, the speed-up curves of
the latest run's stages, a comparison with base runs, the step time breakdown of outer
traces, and what profiling cost each run that recorded it.

Everything is in the one file (no network): the data as JSON in the page, drawn by a small
script into tables and SVG (a timeline lane per AIC or AIV worker, stages coloured; a
stacked bar per core; a line per stage). The page carries summaries, not the run: the
records of the one invocation drawn, one row per core, and the median curve per stage.
The page marks ``<html data-ready="1">`` when it is drawn, and ``data-error`` with the
message if a script failed, so a headless browser can check it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

from multicore_profiler.analysis.analyze import speedup_curves
from multicore_profiler.analysis.compare import Comparison
from multicore_profiler.analysis.replay import FIDELITY_LIMIT
from multicore_profiler.analysis.selection import RecordSelection
from multicore_profiler.errors import AnalysisError, ExportError
from multicore_profiler.export.files import written_aside
from multicore_profiler.storage.runs import CAPTURE_COLUMNS, CaptureCost
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
SELECT core, block_id, record_index, stage, phase, ts_ns, dur_ns
FROM records_ns
WHERE run_id = $run AND rank = $rank AND invocation_id = $invocation
ORDER BY core, block_id, ts_ns, record_index
"""

_GRAPHED = """
SELECT rank, invocation_id
FROM invocations i
WHERE run_id = $run AND has_task_graph(i.run_id, i.rank, i.config_id)
"""
"""The run's invocations that carry their task graph (the timeline's rule)."""

_CORES = """
SELECT core || '/' || block_id AS core, makespan_ns, compute_ns, wait_ns, trigger_ns,
       control_ns, front_gap_ns, gap_ns, tail_gap_ns
FROM core_breakdown
WHERE run_id = $run AND rank = $rank AND invocation_id = $invocation
ORDER BY core_type, block_id
"""
_CORE_PARTS = {
    "compute_ns": "#4c72b0",
    "wait_ns": "#dddddd",
    "trigger_ns": "#444444",
    "control_ns": "#8172b3",
    "front_gap_ns": "#e6b85c",
    "gap_ns": "#f3dca8",
    "tail_gap_ns": "#fbeed3",
}
"""The parts of a core's bar, in the bar's order: they tile the invocation's makespan."""

_CRITICAL = """
SELECT core, block_id, record_index, core || '/' || block_id AS lane, start_ns, dur_ns
FROM critical_path
WHERE run_id = $run AND rank = $rank AND invocation_id = $invocation
ORDER BY seq
"""

_CRITICAL_SHARES = """
SELECT concat_ws(' ', stage, kind) AS name, share
FROM critical_path_summary
WHERE run_id = $run AND rank = $rank AND invocation_id = $invocation
ORDER BY share DESC, stage NULLS LAST, kind
LIMIT 4
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
<div id="capture-costs"></div>
<h2>Stages</h2><table id="stages"></table>
<h2>Timeline of one invocation</h2><p id="timeline-title"></p><p id="critical-path-title"></p>
<div id="timeline"></div>
<h2>Where each core's time goes</h2><p id="cores-title"></p><div id="cores"></div>
<h2>What a faster stage buys</h2><p id="curves-title"></p><div id="curves"></div>
<div id="comparison-section"></div>
<div id="breakdown-section"></div>
<div id="ranks-section"></div>
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
  function swatches(id, names, colorOf) {
    var key = document.createElement("p"); key.id = id;
    names.forEach(function (name) {
      var swatch = document.createElement("span");
      swatch.style.cssText = "display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;"
        + "background:" + colorOf(name);
      key.appendChild(swatch);
      key.appendChild(document.createTextNode(name));
    });
    return key;
  }
  function svgText(parent, x, y, text, anchor) {
    var label = document.createElementNS(SVG, "text");
    label.setAttribute("class", "lane-label");
    label.setAttribute("x", x); label.setAttribute("y", y);
    if (anchor) label.setAttribute("text-anchor", anchor);
    label.textContent = text;
    parent.appendChild(label);
  }
  document.getElementById("summary").textContent = data.summary;
  data.capture_costs.forEach(function (line) {
    var p = document.createElement("p"); p.className = "capture-cost";
    p.textContent = line; document.getElementById("capture-costs").appendChild(p);
  });
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
  var groups = svg.querySelectorAll("g.lane"), rects = [];
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
    rects.push(rect);
  }
  var critical = data.critical;
  if (critical.absent) {
    document.getElementById("critical-path-title").textContent = critical.absent;
  } else {
    document.getElementById("critical-path-title").textContent = critical.title;
    var points = [];
    critical.at.forEach(function (at, seq) {
      var y = laneOf[critical.lane[seq]] * laneHeight + 1 + (laneHeight - 3) / 2;
      var x0 = left + (critical.start_ns[seq] - start) * scale;
      points.push(x0 + "," + y, (x0 + critical.dur_ns[seq] * scale) + "," + y);
      if (at < 0) return;
      rects[at].setAttribute("class", "critical");
      rects[at].setAttribute("data-seq", seq);
      rects[at].setAttribute("stroke", "#d62728");
      rects[at].setAttribute("stroke-width", 1.5);
    });
    var path = document.createElementNS(SVG, "polyline");
    path.setAttribute("id", "critical-path");
    path.setAttribute("points", points.join(" "));
    path.setAttribute("fill", "none");
    path.setAttribute("stroke", "#d62728");
    path.setAttribute("stroke-width", 1);
    svg.appendChild(path);
  }
  document.getElementById("timeline").appendChild(svg);
  document.getElementById("timeline").appendChild(swatches(
    "legend", Object.keys(data.colors).concat(["wait", "trigger"]), function (name) {
      return data.colors[name] || (name === "wait" ? "#ddd" : "#444"); }));

  var cores = data.cores, coreHeight = 12, coreWidth = width - left - 10;
  document.getElementById("cores-title").textContent = "Each core's share of the makespan ("
    + ((cores.makespan_ns[0] || 0) / 1e3).toFixed(2) + " us) of the invocation above, "
    + "AIC then AIV by block: a bar is the whole makespan.";
  var bars = document.createElementNS(SVG, "svg");
  bars.setAttribute("id", "core-breakdown");
  bars.setAttribute("width", width);
  bars.setAttribute("height", cores.core.length * (coreHeight + 3) + 3);
  cores.core.forEach(function (name, index) {
    var g = document.createElementNS(SVG, "g");
    g.setAttribute("class", "core");
    g.setAttribute("data-core", name);
    g.setAttribute("transform", "translate(0," + (index * (coreHeight + 3)) + ")");
    svgText(g, 0, 10, name);
    var x = left, makespan = cores.makespan_ns[index];
    cores.parts.forEach(function (part) {
      var w = makespan > 0 ? cores[part][index] / makespan * coreWidth : 0;
      var segment = document.createElementNS(SVG, "path");
      segment.setAttribute("class", "segment"); segment.setAttribute("data-part", part);
      segment.setAttribute("d", "M" + x + " 0h" + w + "v" + coreHeight + "h" + (-w) + "z");
      segment.setAttribute("fill", cores.colors[part]);
      var tip = document.createElementNS(SVG, "title");
      tip.textContent = name + " " + part + ": " + (cores[part][index] / 1e3).toFixed(2)
        + " us (" + (makespan > 0 ? cores[part][index] / makespan * 100 : 0).toFixed(1) + " %)";
      segment.appendChild(tip);
      g.appendChild(segment);
      x += w;
    });
    bars.appendChild(g);
  });
  document.getElementById("cores").appendChild(bars);
  document.getElementById("cores").appendChild(
    swatches("cores-legend", cores.parts, function (part) { return cores.colors[part]; }));

  var curves = data.curves;
  if (curves.absent) {
    document.getElementById("curves-title").textContent = curves.absent;
  } else {
    document.getElementById("curves-title").textContent = curves.title;
    var plotLeft = 60, plotWidth = 500, plotTop = 24, plotHeight = 260;
    var all = [1];
    curves.stages.forEach(function (c) { all = all.concat(c.ratios); });
    var low = Math.min.apply(null, all), high = Math.max.apply(null, all);
    var pad = Math.max((high - low) * 0.05, 0.005);
    low -= pad; high += pad;
    var most = Math.max.apply(null, curves.speedups.concat([1e-9]));
    function px(s) { return plotLeft + s / most * plotWidth; }
    function py(r) { return plotTop + (high - r) / (high - low) * plotHeight; }
    var plot = document.createElementNS(SVG, "svg");
    plot.setAttribute("id", "speedup-curves");
    plot.setAttribute("width", plotLeft + plotWidth + 20);
    plot.setAttribute("height", plotTop + plotHeight + 40);
    function rule(x1, y1, x2, y2, color) {
      var line = document.createElementNS(SVG, "line");
      line.setAttribute("class", "axis");
      line.setAttribute("x1", x1); line.setAttribute("y1", y1);
      line.setAttribute("x2", x2); line.setAttribute("y2", y2);
      line.setAttribute("stroke", color);
      plot.appendChild(line);
    }
    curves.speedups.forEach(function (s) {
      rule(px(s), plotTop, px(s), plotTop + plotHeight, "#eee");
      svgText(plot, px(s), plotTop + plotHeight + 14, Math.round(s * 100) + " %", "middle");
    });
    for (var tick = 0; tick <= 4; tick++) {
      var r = low + (high - low) * tick / 4;
      rule(plotLeft, py(r), plotLeft + plotWidth, py(r), "#eee");
      svgText(plot, plotLeft - 4, py(r) + 4, r.toFixed(3), "end");
    }
    rule(plotLeft, plotTop + plotHeight, plotLeft + plotWidth, plotTop + plotHeight, "#555");
    rule(plotLeft, plotTop, plotLeft, plotTop + plotHeight, "#555");
    svgText(plot, plotLeft + plotWidth / 2, plotTop + plotHeight + 32,
            "stage compute made faster by", "middle");
    svgText(plot, 4, 12, "predicted / observed makespan");
    var curveColor = function (stage) { return data.colors[stage] || "#999"; };
    curves.stages.forEach(function (c) {
      var line = document.createElementNS(SVG, "polyline");
      line.setAttribute("class", "curve");
      line.setAttribute("data-stage", c.stage);
      line.setAttribute("points", c.ratios.map(function (r, i) {
        return px(curves.speedups[i]) + "," + py(r); }).join(" "));
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", curveColor(c.stage));
      line.setAttribute("stroke-width", 2);
      var tip = document.createElementNS(SVG, "title"); tip.textContent = c.stage;
      line.appendChild(tip);
      plot.appendChild(line);
      c.ratios.forEach(function (r, i) {
        var dot = document.createElementNS(SVG, "circle");
        dot.setAttribute("class", "point");
        dot.setAttribute("data-stage", c.stage);
        dot.setAttribute("data-speedup", curves.speedups[i]);
        dot.setAttribute("data-ratio", r);
        dot.setAttribute("cx", px(curves.speedups[i])); dot.setAttribute("cy", py(r));
        dot.setAttribute("r", 3); dot.setAttribute("fill", curveColor(c.stage));
        var note = document.createElementNS(SVG, "title");
        note.textContent = c.stage + " " + Math.round(curves.speedups[i] * 100) + " % faster: "
          + "makespan x " + r.toFixed(4);
        dot.appendChild(note);
        plot.appendChild(dot);
      });
    });
    document.getElementById("curves").appendChild(plot);
    document.getElementById("curves").appendChild(swatches(
      "curves-legend", curves.stages.map(function (c) { return c.stage; }), curveColor));
  }

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
    part.appendChild(swatches("breakdown-legend", b.parts, function (name) {
      return b.colors[name]; }));
  }
  if (data.ranks) {
    var ranksPart = document.getElementById("ranks-section");
    var ranksHeading = document.createElement("h2");
    ranksHeading.textContent = "Across ranks";
    ranksPart.appendChild(ranksHeading);
    var ranksText = document.createElement("p");
    ranksText.textContent = data.ranks.title;
    ranksPart.appendChild(ranksText);
    data.ranks.maps.forEach(function (m) {
      var caption = document.createElement("p"); caption.textContent = m.title;
      ranksPart.appendChild(caption);
      var cellW = 46, cellH = 20, left = 90, top = 18;
      var grid = document.createElementNS(SVG, "svg");
      grid.setAttribute("class", "heatmap"); grid.setAttribute("data-map", m.name);
      grid.setAttribute("width", left + m.ranks.length * cellW + 10);
      grid.setAttribute("height", top + m.steps.length * cellH + 6);
      m.ranks.forEach(function (rank, j) {
        var t = document.createElementNS(SVG, "text");
        t.setAttribute("class", "lane-label"); t.setAttribute("x", left + j * cellW + 4);
        t.setAttribute("y", 12); t.textContent = "rank " + rank; grid.appendChild(t);
      });
      m.steps.forEach(function (step, i) {
        var row = m.values[i];
        var known = row.filter(function (v) { return v !== null; });
        var lo = Math.min.apply(null, known), hi = Math.max.apply(null, known);
        var label = document.createElementNS(SVG, "text");
        label.setAttribute("class", "lane-label"); label.setAttribute("x", 0);
        label.setAttribute("y", top + i * cellH + 14); label.textContent = "step " + step;
        grid.appendChild(label);
        row.forEach(function (v, j) {
          var rect = document.createElementNS(SVG, "rect");
          rect.setAttribute("class", "cell");
          rect.setAttribute("data-step", step); rect.setAttribute("data-rank", m.ranks[j]);
          rect.setAttribute("x", left + j * cellW); rect.setAttribute("y", top + i * cellH);
          rect.setAttribute("width", cellW - 2); rect.setAttribute("height", cellH - 2);
          var level = v === null || hi === lo ? 0 : (v - lo) / (hi - lo);
          rect.setAttribute("fill", v === null ? "#eeeeee"
            : "rgb(" + Math.round(255 - 59 * level) + "," + Math.round(255 - 177 * level) + ","
              + Math.round(255 - 173 * level) + ")");
          var tip = document.createElementNS(SVG, "title");
          tip.textContent = "step " + step + ", rank " + m.ranks[j] + ": "
            + (v === null ? "no data" : (v / 1e3).toFixed(3) + " us");
          rect.appendChild(tip);
          grid.appendChild(rect);
        });
      });
      ranksPart.appendChild(grid);
    });
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


_JOB_MAPS = {
    "step": (
        "Step time per rank (stage + preparing, us): the darker, the slower in its step",
        """SELECT step, rank, stage_ns + preparing_ns AS value FROM rank_steps
           WHERE job_id = $id""",
    ),
    "wait": (
        "Communication waiting for the last arrival per rank (us; collective_waits)",
        "SELECT step, rank, wait_ns AS value FROM collective_waits WHERE job_id = $id",
    ),
}
_RUN_MAPS = {
    "kernel": (
        "MegaKernel time per rank (the sum of its invocations' makespans, us)",
        """SELECT step, rank, sum(makespan_ns)::BIGINT AS value FROM kernel_rank_invocations
           WHERE job_id = $id GROUP BY ALL""",
    ),
}
"""The heatmaps of the report's cross-rank section: (title, SQL of step, rank, value)."""


def _heatmap(
    store: Store, name: str, title: str, query: str, where: str, runs: list[str] | None = None
) -> dict[str, Any]:
    """One step x rank grid of the values ``query`` gives for ``where`` (a job or run);
    ``runs`` scopes the read to those runs (a run's grid reads no other run's files)."""
    rows = store.sql(query, {"id": where}, runs=runs).to_pylist()
    steps = sorted({row["step"] for row in rows})
    ranks = sorted({row["rank"] for row in rows})
    at = {(row["step"], row["rank"]): row["value"] for row in rows}
    values = [[at.get((step, rank)) for rank in ranks] for step in steps]
    return {"name": name, "title": title, "steps": steps, "ranks": ranks, "values": values}


def _ranks(store: Store, job: str | None, run: str) -> dict[str, Any] | None:
    """The cross-rank heatmaps: of the outer traces' ``job`` where given, and of the
    latest run where it has two ranks or more; ``None`` when there is neither."""
    maps, said = [], []
    if job is not None:
        if not store.sql("SELECT 1 FROM trace_sources WHERE job_id = $id", {"id": job}).num_rows:
            raise ExportError(f"no job {job!r} in {store.uri}")
        maps += [_heatmap(store, n, t, q, job) for n, (t, q) in _JOB_MAPS.items()]
        said.append(f"job {job}")
    ranks = (
        store.sql(
            "SELECT count(DISTINCT rank) AS n FROM invocations WHERE run_id = $id",
            {"id": run},
            runs=[run],
        )
        .column("n")[0]
        .as_py()
    )
    if ranks > 1:
        maps += [_heatmap(store, n, t, q, run, [run]) for n, (t, q) in _RUN_MAPS.items()]
        said.append(f"run {run} ({ranks} ranks)")
    if not maps:
        return None
    return {"title": "Ranks of " + " and ".join(said) + " (see mcprof ranks)", "maps": maps}


_CAPTURE = f"""SELECT run_id, {", ".join(CAPTURE_COLUMNS)} FROM runs
WHERE list_contains($runs, run_id)"""

_WRITER_PLACES = {"process": "in a separate process", "thread": "in a thread of the job's process"}


def _capture_costs(store: Store, selected: list[str]) -> list[str]:
    """A line per selected run that recorded what profiling cost it, in selection order:
    ``Profiling cost the job 0.31 ms per recorded step (writer: 1.2 ms CPU per step, in a
    separate process).``, led by ``Run <id>:`` where several runs are selected."""
    costs = {
        row["run_id"]: CaptureCost.of_row(row)
        for row in store.sql(_CAPTURE, {"runs": selected}, runs=selected).to_pylist()
    }
    lines = []
    for run_id in selected:
        cost = costs.get(run_id)
        per_step = None if cost is None else cost.per_step_ms()
        if per_step is None:
            continue
        lead = f"Run {run_id}: profiling" if len(selected) > 1 else "Profiling"
        lines.append(
            f"{lead} cost the job {per_step[0]} ms per recorded step (writer: {per_step[1]} "
            f"ms CPU per step, {_WRITER_PLACES[cost.writer]})."
        )
    return lines


def _cores(store: Store, where: dict[str, Any]) -> dict[str, Any]:
    """One bar per core of the drawn invocation, AIC then AIV by block: its parts of the
    makespan (``core_breakdown``), as columns."""
    rows = store.sql(_CORES, where, runs=[where["run"]]).to_pydict()
    return {"parts": list(_CORE_PARTS), "colors": _CORE_PARTS, **rows}


def _critical_path(
    store: Store, where: dict[str, Any], graphed: bool, positions: dict[tuple, int]
) -> dict[str, Any]:
    """The drawn invocation's critical path in seq order (``critical_path``): each piece's
    lane, start and duration, and ``at``, the position of its record in the timeline's
    columns (-1 for a gap); or, for an invocation without a task graph, why there is none."""
    described = f"invocation {where['invocation']} of run {where['run']}"
    if not graphed:
        return {
            "absent": f"No critical path: {described} carries no task graph (its kernel "
            "handed over no tasks), so no wait can be charged to the trigger that released it."
        }
    pieces = store.sql(_CRITICAL, where, runs=[where["run"]]).to_pydict()
    shares = store.sql(_CRITICAL_SHARES, where, runs=[where["run"]]).to_pylist()
    keys = zip(pieces["core"], pieces["block_id"], pieces["record_index"], strict=True)
    at = [-1 if key[2] is None else positions[key] for key in keys]
    bound = ", ".join(f"{row['name']} {row['share']:.1%}" for row in shares)
    return {
        "title": f"Critical path of {described} (outlined records and the red line): "
        f"{sum(i >= 0 for i in at)} records in {len(at)} pieces; most of its makespan: {bound}.",
        "at": at,
        "lane": pieces["lane"],
        "start_ns": pieces["start_ns"],
        "dur_ns": pieces["dur_ns"],
    }


def _curves(store: Store, run: str, graphed: set[tuple[int, int]]) -> dict[str, Any]:
    """Per stage, the median over ``run``'s invocations with a task graph (those the replay
    reproduces) of the predicted / observed makespan at each speed-up (``speedup_curves``);
    or why there are none."""
    if not graphed:
        return {
            "absent": f"No speed-up curves: no invocation of run {run} carries a task graph, "
            "so the replay cannot tell what a faster stage would release."
        }
    try:
        rows = speedup_curves(store, RecordSelection(run=run)).to_pylist()
    except AnalysisError as refused:  # an import the replay cannot take: say why
        return {"absent": f"No speed-up curves: {refused}."}
    ratios: dict[str, dict[float, list[float]]] = {}
    used: set[tuple[int, int]] = set()
    for row in rows:
        if (row["rank"], row["invocation_id"]) in graphed and row["ratio"] is not None:
            ratios.setdefault(row["stage"], {}).setdefault(row["speedup"], []).append(row["ratio"])
            used.add((row["rank"], row["invocation_id"]))
    if not used:
        return {
            "absent": f"No speed-up curves: the replay reproduces none of the {len(graphed)} "
            f"invocations of run {run} with a task graph within {FIDELITY_LIMIT:.0%}."
        }
    speedups = sorted({row["speedup"] for row in rows})
    return {
        "title": f"Predicted makespan / observed with one stage's compute made faster: the "
        f"median over {len(used)} of the {len(graphed)} invocations of run {run} with a task "
        f"graph (those the replay reproduces within {FIDELITY_LIMIT:.0%}).",
        "speedups": speedups,
        "stages": [
            {"stage": stage, "ratios": [float(np.median(by[s])) for s in speedups]}
            for stage, by in ratios.items()
        ],
    }


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
    job: str | None = None,
) -> Path:
    """Write the report of the selected runs to ``output``: their stages, the timeline of
    ``invocation`` of the latest run (default: its first), with ``base`` the comparison of
    those runs against the base runs, with ``traces`` (a selector of outer traces) a
    stacked bar of each of their steps' time breakdown, and step x rank heatmaps of the
    latest run's kernel time where it has several ranks and, with ``job``, of that job's
    step time and communication wait."""
    output = Path(output)
    with written_aside(output, ExportError, "the report") as aside:
        page = _page(store, runs, base, invocation, traces, job)
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
    job: str | None = None,
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
    drawn = {"run": latest, "rank": rank, "invocation": invocation_id}
    timeline = store.sql(_TIMELINE, drawn, runs=[latest]).to_pydict()
    keys = zip(timeline["core"], timeline["block_id"], timeline.pop("record_index"), strict=True)
    positions = {key: at for at, key in enumerate(keys)}
    graphed = {
        (row["rank"], row["invocation_id"])
        for row in store.sql(_GRAPHED, {"run": latest}, runs=[latest]).to_pylist()
    }
    curves = _curves(store, latest, graphed)
    shown = {c["stage"] for c in curves.get("stages", ())}
    names = sorted(shown | {name for name in timeline["stage"] if name is not None})
    data = {
        "summary": f"{len(selected)} run(s) selected by {runs}: {', '.join(selected)}",
        "capture_costs": _capture_costs(store, selected),
        "stages": {"columns": stages.column_names, "rows": stages.to_pylist()},
        "timeline": {
            "title": f"{kernel}, run {latest}, rank {rank}, invocation {invocation_id}: "
            f"{len(timeline['ts_ns'])} records on AIC and AIV workers",
            **timeline,
        },
        "colors": {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(names)},
        "cores": _cores(store, drawn),
        "critical": _critical_path(store, drawn, (rank, invocation_id) in graphed, positions),
        "curves": curves,
        "comparison": None if base is None else _comparison(store.compare(base, runs)),
        "breakdown": None if traces is None else _breakdown(store, traces),
        "ranks": _ranks(store, job, latest),
    }
    page = _PAGE.replace("__TITLE__", f"{len(selected)} run(s)")
    return page.replace("__DATA__", script_json(data))
