"""Plotly figures of the dashboard, as plain figure dicts (``Plotly.newPlot(div, data,
layout)``): built directly rather than through ``plotly.graph_objects``, whose validation
costs more than the rest of a render on a long history.

Plotly reads a subset of HTML in every label (``<b>``, ``<br>``), so each string that comes
from the DB (case ids, implementation and machine names, reasons) is HTML-escaped here: it
shows as written, and a ``<script>`` in a case id stays text.
"""

from __future__ import annotations

import datetime as dt
import html
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from reports.data import TIMING_KINDS, Entry, History, Run

#: plotly's default qualitative palette, so series keep one colour in every row
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
MARKER_STYLE = {"regression": ("triangle-up", "#d62728"),
                "suspicious": ("diamond", "#ff9f1c"),
                "improvement": ("triangle-down", "#2ca02c")}
#: plot config: no plotly.com links (the site works offline), responsive width
CONFIG = {"displaylogo": False, "responsive": True,
          "modeBarButtonsToRemove": ["sendDataToCloud", "lasso2d", "select2d"]}


def esc(text: Any) -> str:
    """A DB string made safe for a plotly label."""
    return html.escape(str(text), quote=False)


def when(run: Run) -> str:
    """The x value of a run: its start, UTC, as plotly reads dates."""
    return dt.datetime.fromtimestamp(run.info.started_at, dt.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S")


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _hover_data(e: Entry) -> list[str]:
    run = e.run
    return [esc(run.short), esc(run.commit or "-"), when(run) + " UTC", esc(run.machine_name),
            esc(e.result.status)]


_HOVER = ("run %{customdata[0]} · commit %{customdata[1]}<br>%{customdata[2]}"
          "<br>machine %{customdata[3]} · %{customdata[4]}<extra>%{fullData.name}</extra>")


# ----------------------------------------------------------------------------- error metric


def error_metric(entry: dict[str, Any]) -> tuple[str, float | None, float] | None:
    """(label, value, bound) of the error metric an output's tolerance bounds, or None when it
    has no such number (exact outputs: the check is bitwise). Passing means value <= bound."""
    tol = entry.get("tolerance") if isinstance(entry, dict) else None
    metrics = entry.get("metrics") if isinstance(entry, dict) else None
    if not isinstance(tol, dict) or not isinstance(metrics, dict):
        return None
    parts = (tol.get("parts") or []) if tol.get("kind") == "all_of" else [tol]
    # a global bound (cos_diff, rel_l2) sums up the whole output: prefer it to a per-element one
    part = next((p for p in parts if p.get("kind") in ("cos_diff", "rel_l2")), None)
    part = part or next((p for p in parts if p.get("kind") in ("allclose", "ulp")), None)
    if part is None:
        return None
    kind = part["kind"]
    if kind in ("cos_diff", "rel_l2"):
        label, value, bound = kind, metrics.get(kind), part.get("bound")
    elif kind == "ulp":
        label, value, bound = "max ulp", metrics.get("max_ulp"), part.get("ulps")
    elif "max_tol_ratio" in metrics:  # allclose: the worst element's share of its allowance
        label, value, bound = "worst |a-e| / (atol+rtol|e|)", metrics["max_tol_ratio"], 1.0
    else:
        return None  # recorded before the harness measured the share
    if not isinstance(bound, (int, float)):
        return None
    ok = isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    return label, (float(value) if ok else None), float(bound)


# ----------------------------------------------------------------------------- case trends


#: the rows under latency that read one number per result: (axis title, getter)
_ROWS: tuple[tuple[str, Callable[[Entry], float | None]], ...] = (
    ("TFLOP/s", lambda e: e.result.derived.get("tflops")),
    ("GB/s", lambda e: e.result.derived.get("gbps")),
    ("busbw GB/s", lambda e: e.result.derived.get("busbw_gbps")),
    ("peak MB", lambda e: None if e.result.peak_memory_bytes is None
     else e.result.peak_memory_bytes / 1e6),
    ("% of peak", lambda e: e.result.derived.get(
        "pct_peak_flops", e.result.derived.get("pct_peak_bw"))),
)
ERROR_ROW = "error vs tolerance"
#: rows top to bottom after latency: speed, then correctness, then resources
_ROW_ORDER = ("TFLOP/s", "GB/s", "busbw GB/s", ERROR_ROW, "peak MB", "% of peak")


def _median_us(e: Entry, stat: str = "median") -> float | None:
    v = (e.result.timing or {}).get(stat)
    return v / 1e3 if isinstance(v, (int, float)) and e.result.status == "pass" else None


def series_name(history: History, key: tuple, many_machines: bool) -> str:
    machine, _case, impl, world_size, method = key
    parts = [impl, f"w{world_size}"]
    if method:
        parts.append(method)
    if many_machines:
        parts.append(next((r.machine_name for r in history.runs if r.machine == machine),
                          machine))
    return esc(" ".join(parts))


def case_figure(history: History, entries: Sequence[Entry], markers: dict[tuple, list[dict]]
                ) -> dict[str, Any]:
    """Trends of one case: latency (median, p10-p90 band, change markers), throughput, busbw,
    error metric against its tolerance (log), peak memory and percent of peak, one row each
    where there is something to draw, one colour per series over every row."""
    series: dict[tuple, list[Entry]] = defaultdict(list)
    for e in sorted(entries, key=lambda e: e.run.index):
        series[e.series].append(e)
    many = len({k[0] for k in series}) > 1
    rows: list[tuple[str, list[dict]]] = [("latency µs", [])]
    extra: dict[str, list[dict]] = {}
    error_traces: list[dict] = []
    for i, (key, points) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        name = series_name(history, key, many)
        x = [when(e.run) for e in points]
        custom = [_hover_data(e) for e in points]
        lat = rows[0][1]
        lo, hi = [_median_us(e, "p10") for e in points], [_median_us(e, "p90") for e in points]
        if any(v is not None for v in hi):
            lat.append({"type": "scatter", "x": x, "y": lo, "mode": "lines", "line":
                        {"width": 0}, "hoverinfo": "skip", "showlegend": False,
                        "legendgroup": name, "connectgaps": False})
            lat.append({"type": "scatter", "x": x, "y": hi, "mode": "lines", "line":
                        {"width": 0}, "fill": "tonexty", "fillcolor": _rgba(colour, 0.18),
                        "hoverinfo": "skip", "showlegend": False, "legendgroup": name,
                        "name": f"{name} p10-p90"})
        lat.append({"type": "scatter", "x": x, "y": [_median_us(e) for e in points],
                    "mode": "lines+markers", "name": name, "legendgroup": name,
                    "line": {"color": colour}, "customdata": custom,
                    "hovertemplate": "median %{y:.4g} µs<br>" + _HOVER})
        for kind in TIMING_KINDS:
            hits = [(e, f) for e in points for f in markers.get((*key[1:4], e.run.run_id), ())
                    if f["kind"] == kind]
            if hits:
                symbol, mcolour = MARKER_STYLE[kind]
                lat.append({"type": "scatter", "mode": "markers", "name": f"{kind}",
                            "legendgroup": kind, "showlegend": False,
                            "x": [when(e.run) for e, _ in hits],
                            "y": [_median_us(e) for e, _ in hits],
                            # a triaged change point is drawn hollow: seen, nothing to do
                            "marker": {"symbol": [symbol + ("-open" if f.get("triage") else "")
                                                  for _, f in hits],
                                       "size": 14, "color": mcolour,
                                       "line": {"width": 1, "color": "#222"}},
                            "text": [esc(f"{kind.upper()}: {f['detail']}") for _, f in hits],
                            "hovertemplate": "%{text}<extra></extra>"})
        for label, get in _ROWS:
            ys = [get(e) if e.result.status == "pass" else None for e in points]
            if any(isinstance(v, (int, float)) and v for v in ys):
                extra.setdefault(label, []).append({
                    "type": "scatter", "x": x, "y": ys, "mode": "lines+markers", "name": name,
                    "legendgroup": name, "showlegend": False, "line": {"color": colour},
                    "customdata": custom,
                    "hovertemplate": f"{label} %{{y:.4g}}<br>" + _HOVER})
        error_traces.extend(_error_traces(points, name, colour, x, custom))
    extra[ERROR_ROW] = error_traces
    rows += [(label, extra[label]) for label in _ROW_ORDER if extra.get(label)]
    notes = {}
    measured = [t for t in error_traces if not t["name"].startswith("tolerance")]
    if measured and all(v is None for t in measured for v in t["y"]):
        notes[ERROR_ROW] = ("error 0 in every run (equal to the reference): nothing to draw "
                            "on a log scale")
    return _stack(rows, notes)


def _error_traces(points: list[Entry], name: str, colour: str, x: list[str],
                  custom: list[list[str]]) -> list[dict]:
    traces = []
    outputs = sorted({o for e in points for o in e.result.outputs})
    for j, output in enumerate(outputs):
        vals, bounds, label = [], [], None
        for e in points:
            m = error_metric(e.result.outputs.get(output, {}))
            if m is None:
                vals.append(None)
                bounds.append(None)
                continue
            label = m[0]
            vals.append(m[1])
            bounds.append(m[2])
        if label is None:
            continue
        tag = esc(f"{output}: {label}")
        dash = ("solid", "dot", "dashdot", "longdash")[j % 4]
        traces.append({"type": "scatter", "x": x, "y": vals, "mode": "lines+markers",
                       "name": f"{name} {tag}", "legendgroup": name, "showlegend": False,
                       "line": {"color": colour, "dash": dash}, "customdata": custom,
                       "hovertemplate": f"{tag} %{{y:.3g}}<br>" + _HOVER})
        traces.append({"type": "scatter", "x": x, "y": bounds, "mode": "lines",
                       "name": f"tolerance {tag}", "showlegend": False,
                       "line": {"color": "#d62728", "dash": "dash", "width": 1},
                       "hovertemplate": f"tolerance of {tag}: %{{y:.3g}}<extra></extra>"})
    return traces


def _stack(rows: list[tuple[str, list[dict]]], notes: dict[str, str] | None = None
           ) -> dict[str, Any]:
    """Rows of traces as stacked subplots sharing one date axis; ``notes`` writes a line of
    text inside the row of that title."""
    n = len(rows)
    gap = 0.06 if n > 1 else 0.0
    height = (1.0 - gap * (n - 1)) / n
    layout: dict[str, Any] = {
        "height": 140 + 170 * n, "margin": {"l": 70, "r": 20, "t": 30, "b": 40},
        "hovermode": "closest", "showlegend": True,
        "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0},
        "xaxis": {"type": "date", "anchor": f"y{n if n > 1 else ''}"},
        "template": None, "paper_bgcolor": "white", "plot_bgcolor": "#fafafa",
    }
    data = []
    for i, (label, traces) in enumerate(rows):
        axis = "y" if i == 0 else f"y{i + 1}"
        top = 1.0 - i * (height + gap)
        spec: dict[str, Any] = {"domain": [max(top - height, 0.0), top], "anchor": "x",
                                "title": {"text": label, "font": {"size": 11}},
                                "gridcolor": "#e5e5e5"}
        if label == ERROR_ROW:
            spec["type"] = "log"
            spec["exponentformat"] = "power"
        else:
            spec["rangemode"] = "tozero"
        layout["yaxis" if i == 0 else f"yaxis{i + 1}"] = spec
        if notes and label in notes:
            layout.setdefault("annotations", []).append({
                "text": notes[label], "showarrow": False, "xref": "paper",
                "yref": f"{axis} domain", "x": 0.01, "y": 0.15, "xanchor": "left",
                "font": {"size": 11, "color": "#666"}})
        for t in traces:
            data.append({**t, "xaxis": "x", "yaxis": axis})
    return {"data": data, "layout": layout, "config": CONFIG}


# ----------------------------------------------------------------------------- other charts


def busbw_vs_size(history: History, entries: Sequence[Entry],
                  size_of: Callable[[Entry], float | None]) -> dict[str, Any] | None:
    """Bus bandwidth against message size (bytes per rank, nccl-tests' size column) in the
    newest run of each machine that ran the op: one point per case, a line through each
    size's median, one colour per (implementation, world size)."""
    newest: dict[str, int] = {}
    for e in entries:
        newest[e.run.machine] = max(newest.get(e.run.machine, -1), e.run.index)
    groups: dict[tuple, list[tuple[float, float, Entry]]] = defaultdict(list)
    for e in entries:
        busbw = e.result.derived.get("busbw_gbps")
        size = size_of(e)
        if (e.run.index != newest[e.run.machine] or e.result.status != "pass" or not busbw
                or not size):
            continue
        groups[(e.run.machine_name, e.result.impl, e.result.world_size)].append(
            (size, busbw, e))
    if not groups:
        return None
    many = len({k[0] for k in groups}) > 1
    data = []
    for i, (key, pts) in enumerate(sorted(groups.items())):
        colour = PALETTE[i % len(PALETTE)]
        machine, impl, ws = key
        name = esc(f"{impl} w{ws}" + (f" {machine}" if many else ""))
        pts.sort(key=lambda p: p[0])
        data.append({"type": "scatter", "mode": "markers", "x": [p[0] for p in pts],
                     "y": [p[1] for p in pts], "name": name, "legendgroup": name,
                     "marker": {"color": colour, "size": 7, "opacity": 0.7},
                     "text": [esc(p[2].result.case_id) for p in pts],
                     "hovertemplate": "%{text}<br>%{x:.4s}B: %{y:.4g} GB/s<extra>"
                                      "%{fullData.name}</extra>"})
        by_size: dict[float, list[float]] = defaultdict(list)
        for size, bw, _ in pts:
            by_size[size].append(bw)
        xs = sorted(by_size)
        data.append({"type": "scatter", "mode": "lines", "x": xs,
                     "y": [statistics.median(by_size[s]) for s in xs], "name": name,
                     "legendgroup": name, "showlegend": False, "hoverinfo": "skip",
                     "line": {"color": colour}})
    layout = {"height": 380, "margin": {"l": 70, "r": 20, "t": 30, "b": 50},
              "xaxis": {"type": "log", "title": {"text": "message size per rank (bytes)"}},
              "yaxis": {"title": {"text": "busbw GB/s"}, "rangemode": "tozero"},
              "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom"},
              "template": None, "paper_bgcolor": "white", "plot_bgcolor": "#fafafa"}
    return {"data": data, "layout": layout, "config": CONFIG}


_STATUS_COLOURS = {"pass": "#2ca02c", "fail": "#d62728", "error": "#9467bd",
                   "timeout": "#8c564b", "crash": "#e377c2", "skip": "#bcbd22"}


def runs_figure(history: History, limit: int = 60) -> dict[str, Any]:
    """Results per status for the newest ``limit`` runs, one stacked bar per run."""
    runs = history.runs[-limit:]
    x = [f"{when(r)} {r.short}" for r in runs]
    custom = [[esc(r.short), esc(r.commit or "-"), esc(r.machine_name),
               esc(r.info.tier)] for r in runs]
    data = []
    for status, colour in _STATUS_COLOURS.items():
        ys = [r.counts.get(status, 0) for r in runs]
        if any(ys):
            data.append({"type": "bar", "x": x, "y": ys, "name": status,
                         "marker": {"color": colour}, "customdata": custom,
                         "hovertemplate": f"{status}: %{{y}}<br>run %{{customdata[0]}} · "
                                          "commit %{customdata[1]}<br>machine "
                                          "%{customdata[2]} · tier %{customdata[3]}"
                                          "<extra></extra>"})
    layout = {"barmode": "stack", "height": 300, "margin": {"l": 50, "r": 20, "t": 30,
                                                             "b": 90},
              "xaxis": {"type": "category", "tickangle": -30, "tickfont": {"size": 9}},
              "yaxis": {"title": {"text": "results"}},
              "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom"},
              "template": None, "paper_bgcolor": "white", "plot_bgcolor": "#fafafa"}
    return {"data": data, "layout": layout, "config": CONFIG}


def sparkline(values: Sequence[float], width: int = 140, height: int = 28) -> str:
    """Points of an SVG polyline through ``values`` (an op's latency index per run)."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    step = width / max(len(values) - 1, 1)
    return " ".join(f"{i * step:.1f},{height - 2 - (v - lo) / span * (height - 4):.1f}"
                    for i, v in enumerate(values))
