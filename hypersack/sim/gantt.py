"""Per-GPU timelines as an SVG Gantt chart: one row per GPU, one lane per concurrent
trial, labelled where a label fits; a time axis with ticks; the occupancy over time
below; and the one-trial-per-GPU makespan marked, the baseline packing is measured by."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

from hypersack.sim.results import Segment

_PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#bab0ac"]
WIDTH, LEFT, RIGHT, TOP = 1100, 150, 20, 56
LANE_H, GAP, OCC_H = 12, 10, 70
CHAR_W = 5.6  # width of a character at font-size 9, for "does the label fit"


def _lanes(segments: list[Segment]) -> list[tuple[Segment, int]]:
    ends: list[float] = []
    out = []
    for s in sorted(segments, key=lambda s: (s.start_s, s.trial_id)):
        for lane, end in enumerate(ends):
            if end <= s.start_s + 1e-9:
                ends[lane] = s.end_s
                break
        else:
            lane = len(ends)
            ends.append(s.end_s)
        out.append((s, lane))
    return out


def nice_step(span_s: float, target: int = 10) -> float:
    """A tick step of 1, 2 or 5 times a power of ten giving about `target` ticks."""
    raw = max(span_s, 1e-9) / target
    power = 10.0 ** math.floor(math.log10(raw))
    return float(next(m * power for m in (1, 2, 5, 10) if m * power >= raw))


def _short(trial_id: str) -> str:
    """`sp1-1-t00012` -> `t00012`: the part that tells a study's trials apart."""
    return trial_id.rsplit("-", 1)[-1]


def gantt_svg(timeline: Sequence[Segment], gpus: Sequence[tuple[str, int, str]],
              makespan_s: float, title: str = "",
              occupancy: Sequence[tuple[float, float]] = (),
              baseline_s: float | None = None) -> str:
    span = max(makespan_s, baseline_s or 0.0, 1e-9)
    plot_w = WIDTH - LEFT - RIGHT
    scale = plot_w / span

    def x(t: float) -> float:
        return LEFT + t * scale

    models = sorted({s.model for s in timeline})
    color = {m: _PALETTE[i % len(_PALETTE)] for i, m in enumerate(models)}
    body: list[str] = []
    y = TOP
    for node, index, arch in gpus:
        segs = [s for s in timeline if s.node == node and s.gpu_index == index]
        placed = _lanes(segs)
        n_lanes = max((lane for _, lane in placed), default=0) + 1
        height = n_lanes * LANE_H
        body.append(f'<text x="5" y="{y + height / 2 + 4:.1f}" font-size="11">'
                    f'{html.escape(node)}:{index} {html.escape(arch)}</text>')
        body.append(f'<rect x="{LEFT}" y="{y}" width="{plot_w}" height="{height}" '
                    'fill="#f4f4f4"/>')
        for s, lane in placed:
            fill = "#333" if s.outcome == "PROFILE" else color[s.model]
            opacity = "0.35" if s.outcome in ("LOST", "KILLED") else "1"
            w = max(0.5, (s.end_s - s.start_s) * scale)
            top = y + lane * LANE_H
            body.append(
                f'<rect class="trial" x="{x(s.start_s):.2f}" y="{top}" width="{w:.2f}" '
                f'height="{LANE_H - 1}" fill="{fill}" fill-opacity="{opacity}"><title>'
                f'{html.escape(s.trial_id)}{f" ({s.members} fused)" if s.members > 1 else ""} '
                f'{s.outcome} {s.start_s:.0f}-{s.end_s:.0f} s'
                '</title></rect>')
            label = _short(s.trial_id) if s.outcome != "PROFILE" else "profile"
            if s.members > 1:
                label = f"x{s.members} " + _short(s.trial_id.split(".k")[0])
            if w >= CHAR_W * len(label) + 4:
                body.append(f'<text class="label" x="{x(s.start_s) + 2:.2f}" '
                            f'y="{top + LANE_H - 3}" font-size="9" fill="white">'
                            f'{html.escape(label)}</text>')
        y += height + GAP
    rows_bottom = y - GAP
    # Occupancy over time: the mean share of the GPUs' scaled compute in use.
    occ_top = rows_bottom + 30
    parts: list[str] = []
    if occupancy:
        points = []
        for i, (t, share) in enumerate(occupancy):
            end = occupancy[i + 1][0] if i + 1 < len(occupancy) else makespan_s
            level = occ_top + OCC_H * (1 - min(1.0, max(0.0, share)))
            points += [f"{x(t):.2f},{level:.2f}", f"{x(end):.2f},{level:.2f}"]
        parts.append(f'<text x="5" y="{occ_top + OCC_H / 2 + 4}" font-size="11">occupancy</text>'
                     f'<rect x="{LEFT}" y="{occ_top}" width="{plot_w}" height="{OCC_H}" '
                     'fill="#f4f4f4"/>'
                     f'<text x="{LEFT - 34}" y="{occ_top + 9}" font-size="9">100 %</text>'
                     f'<text x="{LEFT - 22}" y="{occ_top + OCC_H}" font-size="9">0 %</text>'
                     f'<polyline class="occupancy" points="{" ".join(points)}" fill="none" '
                     'stroke="#1f77b4" stroke-width="1.5"/>')
        bottom = occ_top + OCC_H
    else:
        bottom = rows_bottom
    # Time axis: ticks and grid lines over the rows and the occupancy strip.
    step = nice_step(span)
    ticks = []
    t = 0.0
    while t <= span + 1e-9:
        ticks.append(f'<line class="tick" x1="{x(t):.2f}" y1="{TOP - 6}" x2="{x(t):.2f}" '
                     f'y2="{bottom}" stroke="#ccc" stroke-width="0.5"/>'
                     f'<text x="{x(t) - 8:.2f}" y="{TOP - 10}" font-size="10">{t:g}</text>')
        t += step
    ticks.append(f'<text x="{LEFT - 60}" y="{TOP - 10}" font-size="10">time (s)</text>')
    marks = [f'<line class="makespan" x1="{x(makespan_s):.2f}" y1="{TOP - 6}" '
             f'x2="{x(makespan_s):.2f}" y2="{bottom}" stroke="#2ca02c" stroke-width="1.5"/>'
             f'<text x="{x(makespan_s) + 3:.2f}" y="{bottom + 14}" font-size="10" '
             f'fill="#2ca02c">makespan {makespan_s:.0f} s</text>']
    if baseline_s:
        marks.append(f'<line class="baseline" x1="{x(baseline_s):.2f}" y1="{TOP - 6}" '
                     f'x2="{x(baseline_s):.2f}" y2="{bottom}" stroke="#d62728" '
                     'stroke-width="1.5" stroke-dasharray="6,3"/>'
                     f'<text x="{min(x(baseline_s), WIDTH - 190) + 3:.2f}" y="{bottom + 28}" '
                     f'font-size="10" fill="#d62728">one trial per GPU {baseline_s:.0f} s'
                     '</text>')
    legend_y = bottom + 44
    legend = []
    for i, m in enumerate(models):
        lx = LEFT + (i % 7) * 130
        ly = legend_y + (i // 7) * 18
        legend.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{color[m]}"/>'
                      f'<text x="{lx + 16}" y="{ly + 11}" font-size="11">{html.escape(m)}</text>')
    height = legend_y + 18 * (1 + (len(models) - 1) // 7 if models else 0) + 16
    head = f'<text x="5" y="18" font-size="14">{html.escape(title)}</text>'
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
            f'{head}{"".join(ticks)}{"".join(body)}{"".join(parts)}{"".join(marks)}'
            f'{"".join(legend)}</svg>\n')


SHARE_H = 260


def shares_svg(shares: dict[str, Sequence[tuple[float, float]]], end_s: float,
               title: str = "", labels: dict[str, str] | None = None,
               marks: Sequence[tuple[float, str]] = ()) -> str:
    """Each study's share of the cluster's scaled compute over time, one step line per
    study on one plot (0 to 100 %), with marked moments (submissions) as dashed lines."""
    labels = labels or {}
    span = max(end_s, 1e-9)
    plot_w = WIDTH - LEFT - RIGHT
    top, bottom = TOP, TOP + SHARE_H

    def x(t: float) -> float:
        return LEFT + min(t, span) * plot_w / span

    def y(share: float) -> float:
        return bottom - SHARE_H * min(1.0, max(0.0, share))

    parts = [f'<rect x="{LEFT}" y="{top}" width="{plot_w}" height="{SHARE_H}" fill="#f4f4f4"/>']
    for pct in (0, 25, 50, 75, 100):
        yy = y(pct / 100)
        parts.append(f'<line x1="{LEFT}" y1="{yy:.1f}" x2="{LEFT + plot_w}" y2="{yy:.1f}" '
                     f'stroke="#ddd" stroke-width="0.5"/><text x="{LEFT - 36}" '
                     f'y="{yy + 3:.1f}" font-size="9">{pct} %</text>')
    step = nice_step(span)
    t = 0.0
    while t <= span + 1e-9:
        parts.append(f'<text x="{x(t) - 8:.2f}" y="{bottom + 14}" font-size="10">{t:g}</text>')
        t += step
    parts.append(f'<text x="{LEFT + plot_w / 2 - 20:.0f}" y="{bottom + 30}" font-size="10">'
                 'time (s)</text>')
    for at, text in marks:
        parts.append(f'<line class="mark" x1="{x(at):.2f}" y1="{top}" x2="{x(at):.2f}" '
                     f'y2="{bottom}" stroke="#555" stroke-dasharray="4,3"/>'
                     f'<text x="{x(at) + 3:.2f}" y="{top + 12}" font-size="10">'
                     f'{html.escape(text)}</text>')
    legend = []
    for i, (sid, series) in enumerate(shares.items()):
        color = _PALETTE[i % len(_PALETTE)]
        points = []
        for j, (t0, share) in enumerate(series):
            t1 = series[j + 1][0] if j + 1 < len(series) else end_s
            points += [f"{x(t0):.2f},{y(share):.2f}", f"{x(t1):.2f},{y(share):.2f}"]
        parts.append(f'<polyline class="share" points="{" ".join(points)}" fill="none" '
                     f'stroke="{color}" stroke-width="1.6"><title>{html.escape(sid)}</title>'
                     '</polyline>')
        ly = bottom + 44 + 18 * i
        legend.append(f'<rect x="{LEFT}" y="{ly}" width="12" height="12" fill="{color}"/>'
                      f'<text x="{LEFT + 16}" y="{ly + 11}" font-size="11">'
                      f'{html.escape(labels.get(sid, sid))}</text>')
    height = bottom + 44 + 18 * len(shares) + 10
    head = (f'<text x="5" y="18" font-size="14">{html.escape(title)}</text>'
            f'<text x="5" y="{top + SHARE_H / 2:.0f}" font-size="11">share</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>'
            f'{head}{"".join(parts)}{"".join(legend)}</svg>\n')
