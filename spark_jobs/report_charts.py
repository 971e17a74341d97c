"""The report's charts as Vega-Lite specs, built with Altair.

* :func:`timeline_chart`: the incident timeline of one run: one lane per broker and per client,
  each with three tracks (traffic: requests and unanswered requests per bucket; errors by
  name; events: Metadata requests, disconnects, leader moves), broker outages as bands across
  their lane, and the findings' spans on a lane of their own. Buckets without a request have no
  mark, so a gap in the data is a gap; the x axis zooms and pans (drag, wheel).
* :func:`sources_chart`: when the dataset holds several runs, their spans on one time axis.
* :func:`metadata_chart`: each client's Metadata request interval (p50, max) on a log scale,
  and the clients that never asked.

Specs are plain dicts (``Chart.to_dict()``); the page embeds them with Vega-Embed. A chart's
rows stay out of Altair (:class:`_Datasets`): each layer names its rows, and the spec carries
them in its top-level ``datasets``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import altair as alt

from spark_jobs.findings import Finding
from spark_jobs.report_model import Lane, seconds_text

__all__ = ["MAX_LANES", "error_color_map", "metadata_chart", "sources_chart", "timeline_chart"]

Rows = list[dict[str, Any]]

#: Lanes drawn per run; past it the least busy clients (brokers' own connections first) are
#: left to the Parquet result.
MAX_LANES = 40
WIDTH = 1000
_TRACKS = ["traffic", "errors", "events"]
_ENDED_BY = {
    "client_fin": "closed by client",
    "client_rst": "reset by client",
    "broker_fin": "closed by broker",
    "broker_rst": "reset by broker",
    "refused": "connection refused",
    "syn_unanswered": "connect unanswered",
}
_EVENT_COLORS = {
    "unanswered request": "#ff7f0e",
    "Metadata request": "#1f77b4",
    "closed by client": "#9e9e9e",
    "reset by client": "#616161",
    "closed by broker": "#8c564b",
    "reset by broker": "#5d3a1a",
    "connection refused": "#000000",
    "connect unanswered": "#444444",
    "leader moved here": "#2ca02c",
    "leader moved away": "#98df8a",
    "broker outage": "#d62728",
}
_ERROR_COLORS = [
    "#e377c2",
    "#9467bd",
    "#bcbd22",
    "#17becf",
    "#ff9896",
    "#7b4173",
    "#c49c94",
    "#393b79",
    "#d6616b",
    "#637939",
    "#8ca252",
    "#e7969c",
    "#a55194",
    "#6b6ecf",
    "#ce6dbd",
    "#b5cf6b",
]
_SHAPES = {
    "Metadata request": "triangle-down",
    "leader moved here": "triangle-up",
    "leader moved away": "triangle-down",
}
_SEVERITY_COLORS = {"critical": "#c62828", "warning": "#ef8f00", "info": "#1e6fc2"}


class _Datasets:
    """A chart's rows, kept out of Altair: :meth:`data` names a layer's rows
    (``alt.Data(name=...)``) and :meth:`spec` puts them in the spec's top-level ``datasets``,
    where Vega-Lite looks named data up.

    Given inline (``alt.Data(values=rows)``), Altair checked every row against Vega-Lite's JSON
    schema and copied it several times: on 100k synthetic exchanges, building the report page
    took 5.2 s of a 36.8 s ``kwire analyze`` (cProfile: 7.2 of 13.5 s in jsonschema, 1.7 s in
    Altair's deep copies). ``INLINE`` gives the rows inline as before (the tests compare both)."""

    INLINE = False

    def __init__(self) -> None:
        self.rows: dict[str, Rows] = {}

    def data(self, rows: Rows) -> alt.Data:
        if self.INLINE:
            return alt.Data(values=rows)
        name = f"rows-{len(self.rows)}"
        self.rows[name] = rows
        return alt.Data(name=name)

    def spec(self, chart: alt.TopLevelMixin) -> dict[str, Any]:
        spec = chart.to_dict()
        if self.rows:
            spec["datasets"] = {**spec.get("datasets", {}), **self.rows}
        return spec


def _ms(t: datetime | None) -> float | None:
    return t.timestamp() * 1000 if t else None


def _clock(t: datetime | None) -> str:
    return t.strftime("%H:%M:%S.%f")[:-3] if t else ""


def _time_axis(span_s: float) -> alt.Axis:
    fmt = "%H:%M:%S" if span_s < 86400 else "%m-%d %H:%M"
    return alt.Axis(format=fmt, title="time (UTC)", labelOverlap=True, grid=True, tickCount=12)


def _kept_lanes(lanes: list[Lane]) -> tuple[list[Lane], int]:
    """At most MAX_LANES lanes: every broker, then clients by importance."""
    if len(lanes) <= MAX_LANES:
        return lanes, 0
    brokers = [ln for ln in lanes if ln.kind == "broker"]
    clients = sorted(
        (ln for ln in lanes if ln.kind == "client"),
        key=lambda ln: (
            ln.internal,
            -ln.totals["error_results"],
            -ln.totals["unanswered"],
            -ln.totals["requests"],
        ),
    )
    room = max(MAX_LANES - len(brokers), 0)
    kept = {id(ln) for ln in brokers + clients[:room]}
    shown = [ln for ln in lanes if id(ln) in kept]
    return shown, len(lanes) - len(shown)


def error_color_map(names: Iterable[str]) -> dict[str, str]:
    """A colour per error name, in the given order (most frequent first keeps the clearest
    colours for the errors that matter most)."""
    return {n: _ERROR_COLORS[i % len(_ERROR_COLORS)] for i, n in enumerate(dict.fromkeys(names))}


def _finding_spans(
    found: Iterable[Finding], source: str | None, first: datetime | None, last: datetime | None, lane: str
) -> Rows:
    """The findings with a time as marks on the findings lane, numbered as on the page. Findings
    whose spans overlap (or nearly: 2% of the run) make one mark, coloured by the most severe,
    so that 30 findings of one incident do not print 30 labels over each other."""
    timed = [
        (i, f) for i, f in enumerate(found, 1) if f.first_time is not None and f.source in (None, source)
    ]
    timed.sort(key=lambda p: p[1].first_time)
    near = ((last - first).total_seconds() * 20 if first and last else 0) or 1000.0  # ms: 2% of the run
    clusters: list[list[tuple[int, Finding]]] = []
    end = None
    for i, f in timed:
        t, t2 = _ms(f.first_time), _ms(f.last_time or f.first_time)
        if clusters and t <= end + near:
            clusters[-1].append((i, f))
            end = max(end, t2)
        else:
            clusters.append([(i, f)])
            end = t2
    out = []
    severities = list(_SEVERITY_COLORS)
    for members in clusters:
        numbers = sorted(i for i, _ in members)
        label = f"#{numbers[0]}" if len(numbers) == 1 else f"#{numbers[0]}…#{numbers[-1]} ({len(numbers)})"
        if len(numbers) > 1 and numbers != list(range(numbers[0], numbers[-1] + 1)):
            label = f"{len(numbers)} findings"
        start = min(f.first_time for _, f in members)
        stop = max(f.last_time or f.first_time for _, f in members)
        summaries = [f"#{i} {f.summary}" for i, f in sorted(members, key=lambda p: p[0])]
        out.append(
            {
                "lane": lane,
                "t": _ms(start),
                "t2": _ms(stop),
                "what": min((f.severity for _, f in members), key=severities.index),
                "label": label,
                "summary": summaries[0] + (f" (and {len(summaries) - 1} more)" if len(summaries) > 1 else ""),
                "at": f"{_clock(start)} to {_clock(stop)}",
            }
        )
    return out


def timeline_chart(
    source: str | None,
    lanes: list[Lane],
    timeline: Rows,
    outages: Rows,
    found: Iterable[Finding],
    *,
    first: datetime | None,
    last: datetime | None,
    error_colors: dict[str, str] | None = None,
) -> tuple[dict[str, Any], int]:
    """The incident timeline of one run as a Vega-Lite spec, and how many lanes were left out.
    ``error_colors`` (:func:`error_colors`) keeps an error's colour the same on every run's chart."""
    shown, left_out = _kept_lanes([ln for ln in lanes if ln.source == source])
    names = {(ln.kind, ln.key): ln.name for ln in shown}
    findings_lane = "findings"
    order = [findings_lane] + [ln.name for ln in shown]
    traffic, marks = [], []
    error_names: list[str] = []
    for r in timeline:
        if r.get("source") != source:
            continue
        key = (
            (r.get("source"), r.get("client_id"), r.get("client_ip"))
            if r.get("lane_kind") == "client"
            else (r.get("source"), r.get("broker_ip"), r.get("broker_port"))
        )
        lane = names.get((r.get("lane_kind"), key))
        if lane is None:
            continue
        t = _ms(r["bucket"])
        t2 = t + float(r["bucket_s"]) * 1000
        base = {"lane": lane, "t": t, "t2": t2, "n": int(r["count"]), "at": _clock(r["bucket"])}
        event = r.get("event")
        if event == "requests":
            traffic.append({**base, "track": "traffic", "what": "requests"})
        elif event == "unanswered":
            traffic.append({**base, "track": "traffic", "what": "unanswered request"})
        elif event == "error":
            what = r.get("detail") or f"error {r.get('code')}"
            if what not in error_names:
                error_names.append(what)
            marks.append({**base, "track": "errors", "what": what, "code": r.get("code")})
        elif event == "metadata":
            marks.append({**base, "track": "events", "what": "Metadata request"})
        elif event == "disconnect":
            marks.append({**base, "track": "events", "what": _ENDED_BY.get(r.get("detail"), r.get("detail"))})
        elif event in ("leader_in", "leader_out"):
            what = "leader moved here" if event == "leader_in" else "leader moved away"
            marks.append({**base, "track": "events", "what": what, "topic": r.get("detail")})
    for m in marks:
        m["shape"] = m["what"] if m["what"] in _SHAPES else "other"
    bands = []
    broker_names = {ln.key[1:]: ln.name for ln in shown if ln.kind == "broker"}
    for r in outages:
        if r.get("source") != source:
            continue
        lane = broker_names.get((r.get("broker_ip"), r.get("broker_port")))
        start = r.get("start")
        end = r.get("end") or last
        if lane is None or start is None or end is None:
            continue
        bands.append(
            {
                "lane": lane,
                "t": _ms(start),
                "t2": _ms(end),
                "what": "broker outage",
                "kind": r.get("kind"),
                "at": f"{_clock(start)} to {_clock(r.get('end')) or 'the end of the data'}",
                "duration": seconds_text(r.get("duration_s")) or "ongoing",
                "n": int(r.get("requests_unanswered") or 0),
            }
        )
    spans = _finding_spans(found, source, first, last, findings_lane)

    domain = [*_EVENT_COLORS, *error_names]
    colors = error_colors or error_color_map(error_names)
    palette = [*_EVENT_COLORS.values()] + [colors.get(n, "#7f7f7f") for n in error_names]
    color = alt.Color(
        "what:N",
        scale=alt.Scale(domain=domain, range=palette),
        legend=alt.Legend(
            title="event", orient="bottom", columns=4, symbolLimit=60, symbolOpacity=1, labelLimit=260
        ),
    )
    span_s = ((last - first).total_seconds() if first and last else 60) or 1
    pad = span_s * 1000 * 0.01
    x_scale = alt.Scale(
        type="utc", domain=[_ms(first) - pad, _ms(last) + pad] if first and last else alt.Undefined
    )
    x = alt.X("t:T", scale=x_scale, axis=_time_axis(span_s))
    y = alt.Y(
        "lane:N",
        sort=order,
        scale=alt.Scale(domain=order, paddingInner=0.15),
        axis=alt.Axis(title=None, labelLimit=260, labelFontSize=11),
    )
    y_offset = alt.YOffset("track:N", scale=alt.Scale(domain=_TRACKS, paddingInner=0.1))
    zoom = alt.selection_interval(bind="scales", encodings=["x"])
    data = _Datasets()
    layers = []
    if bands:
        layers.append(
            alt.Chart(data.data(bands))
            .mark_rect(opacity=0.25)
            .encode(
                x=x,
                x2="t2:T",
                y=y,
                color=color,
                tooltip=[
                    alt.Tooltip("lane:N", title="broker"),
                    alt.Tooltip("kind:N", title="outage"),
                    alt.Tooltip("at:N", title="when"),
                    alt.Tooltip("duration:N"),
                    alt.Tooltip("n:Q", title="requests unanswered"),
                ],
            )
        )
    if traffic:
        requests = [r for r in traffic if r["what"] == "requests"]
        top = max((r["n"] for r in requests), default=1)
        layers.append(
            alt.Chart(data.data(requests))
            .mark_rect(color="#607d8b")
            .encode(
                x=x,
                x2="t2:T",
                y=y,
                yOffset=y_offset,
                opacity=alt.Opacity(
                    "n:Q", scale=alt.Scale(type="log", domain=[1, max(top, 2)], range=[0.25, 1]), legend=None
                ),
                tooltip=[
                    alt.Tooltip("lane:N"),
                    alt.Tooltip("at:N", title="bucket"),
                    alt.Tooltip("n:Q", title="requests"),
                ],
            )
        )
        unanswered = [r for r in traffic if r["what"] != "requests"]
        if unanswered:
            layers.append(
                alt.Chart(data.data(unanswered))
                .mark_rect()
                .encode(
                    x=x,
                    x2="t2:T",
                    y=y,
                    yOffset=y_offset,
                    color=color,
                    tooltip=[
                        alt.Tooltip("lane:N"),
                        alt.Tooltip("at:N", title="bucket"),
                        alt.Tooltip("n:Q", title="requests never answered"),
                    ],
                )
            )
    shape = alt.Shape(
        "shape:N",
        scale=alt.Scale(domain=[*list(_SHAPES), "other"], range=[*_SHAPES.values(), "square"]),
        legend=None,
    )
    tooltip = [
        alt.Tooltip("lane:N"),
        alt.Tooltip("what:N", title="event"),
        alt.Tooltip("at:N", title="bucket"),
        alt.Tooltip("n:Q", title="count"),
        alt.Tooltip("topic:N"),
    ]
    # leader moves are rare and matter: drawn last, larger and outlined, so no disconnect hides one
    for rare in (False, True):
        mine = [m for m in marks if m["what"].startswith("leader moved") == rare]
        if mine:
            layers.append(
                alt.Chart(data.data(mine))
                .mark_point(
                    filled=True,
                    size=150 if rare else 60,
                    opacity=1 if rare else 0.9,
                    stroke="#000" if rare else None,
                    strokeWidth=0.8 if rare else 0,
                )
                .encode(x=x, y=y, yOffset=y_offset, color=color, shape=shape, tooltip=tooltip)
            )
    for severity, colour in _SEVERITY_COLORS.items():
        mine = [s for s in spans if s["what"] == severity]
        if not mine:
            continue
        spans_data = data.data(mine)
        layers.append(
            alt.Chart(spans_data)
            .mark_rect(height=14, cornerRadius=2, color=colour, opacity=0.45)
            .encode(
                x=x,
                x2="t2:T",
                y=y,
                tooltip=[
                    alt.Tooltip("label:N", title="finding"),
                    alt.Tooltip("summary:N"),
                    alt.Tooltip("at:N", title="when"),
                ],
            )
        )
        layers.append(
            alt.Chart(spans_data)
            .mark_text(align="left", baseline="middle", dx=3, fontSize=10, fontWeight="bold", color="#222")
            .encode(x=x, y=y, text="label:N")
        )
    if not layers:
        layers.append(
            alt.Chart(data.data([{"lane": findings_lane, "t": _ms(first) or 0}]))
            .mark_point(opacity=0)
            .encode(x=x, y=y)
        )
    layers[0] = layers[0].add_params(zoom)
    chart = (
        alt.layer(*layers)
        .properties(
            width=WIDTH,
            height=max(22 * len(order), 80),
        )
        .configure_view(stroke="#ccc")
    )
    return data.spec(chart), left_out


def sources_chart(sources: list[dict[str, Any]]) -> dict[str, Any]:
    """Each run's span on one time axis: the gaps between runs stay visible."""
    values = [
        {
            "source": s["source"],
            "t": _ms(s["first"]),
            "t2": _ms(s["last"]),
            "span": f"{_clock(s['first'])} to {_clock(s['last'])}",
            "exchanges": s["exchanges"],
        }
        for s in sources
        if s.get("first") and s.get("last")
    ]
    first = min(v["t"] for v in values) if values else 0
    last = max(v["t2"] for v in values) if values else 1
    span_s = max((last - first) / 1000, 1)
    data = _Datasets()
    chart = (
        alt.Chart(data.data(values))
        .mark_rect(height=14, color="#607d8b")
        .encode(
            x=alt.X("t:T", scale=alt.Scale(type="utc"), axis=_time_axis(span_s)),
            x2="t2:T",
            y=alt.Y("source:N", axis=alt.Axis(title=None, labelLimit=300)),
            tooltip=["source:N", alt.Tooltip("span:N", title="span"), alt.Tooltip("exchanges:Q", format=",")],
        )
        .properties(width=WIDTH, height=max(24 * len(values), 40))
    )
    return data.spec(chart)


def metadata_chart(rows: Rows, names: dict[tuple, str]) -> dict[str, Any]:
    """Per client: p50 and max interval between its Metadata requests (log scale, seconds with
    the precision they need); clients with fewer than two requests are listed with why."""
    points, notes = [], []
    for r in rows:
        name = names.get((r.get("source"), r.get("client_id"), r.get("client_ip"))) or (
            r.get("client_id") or "?"
        )
        n = int(r.get("metadata_requests") or 0)
        if r.get("interval_p50_s") is None:
            text = "never asked for Metadata" if n == 0 else "one Metadata request"
            notes.append(
                {"client": name, "note": f"{text} in {seconds_text(r.get('active_s')) or 'its time'}"}
            )
            continue
        p50, mx = float(r["interval_p50_s"]), float(r.get("interval_max_s") or r["interval_p50_s"])
        points.append(
            {
                "client": name,
                "p50": max(p50, 0.001),
                "max": max(mx, 0.001),
                "p50_text": seconds_text(p50),
                "max_text": seconds_text(mx),
                "requests": n,
            }
        )
    order = [p["client"] for p in sorted(points, key=lambda p: -p["max"])] + [n["client"] for n in notes]
    lo = min([p["p50"] for p in points] + [0.01])
    hi = max([p["max"] for p in points] + [1.0])
    x = alt.X(
        "p50:Q",
        scale=alt.Scale(type="log", domain=[lo / 2, hi * 2]),
        axis=alt.Axis(title="seconds between Metadata requests (log)"),
    )
    y = alt.Y(
        "client:N", sort=order, scale=alt.Scale(domain=order), axis=alt.Axis(title=None, labelLimit=260)
    )
    tooltip = [
        "client:N",
        alt.Tooltip("requests:Q", title="Metadata requests"),
        alt.Tooltip("p50_text:N", title="interval p50"),
        alt.Tooltip("max_text:N", title="interval max"),
    ]
    data = _Datasets()
    base = alt.Chart(data.data(points))
    layers = [
        base.mark_rule(color="#9e9e9e").encode(x=x, x2="max:Q", y=y),
        base.mark_point(filled=True, size=70, color="#1f77b4").encode(x=x, y=y, tooltip=tooltip),
        base.mark_tick(color="#d62728", thickness=2, size=14).encode(x=alt.X("max:Q"), y=y, tooltip=tooltip),
        base.mark_text(align="left", dx=8, fontSize=10, color="#333")
        .encode(x=alt.X("max:Q"), y=y, text=alt.Text("label:N"))
        .transform_calculate(label="datum.p50_text + ' p50, ' + datum.max_text + ' max'"),
    ]
    if notes:
        layers.append(
            alt.Chart(data.data(notes))
            .transform_calculate(p50=str(lo / 2))
            .mark_text(align="left", dx=4, fontSize=11, color="#c62828")
            .encode(x=x, y=y, text="note:N")
        )
    chart = alt.layer(*layers).properties(width=WIDTH - 300, height=max(20 * len(order), 40))
    return data.spec(chart)
