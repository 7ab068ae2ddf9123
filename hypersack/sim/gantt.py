"""Per-GPU timelines as an SVG Gantt chart: one row per GPU, one lane per concurrent trial."""

from __future__ import annotations

import html
from collections.abc import Sequence

from hypersack.sim.simulator import Segment

_PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#bab0ac"]


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


def gantt_svg(timeline: Sequence[Segment], gpus: Sequence[tuple[str, int, str]],
              makespan_s: float, title: str = "") -> str:
    width, left, lane_h, gap, top = 1100, 150, 6, 10, 40
    scale = (width - left - 20) / max(makespan_s, 1e-9)
    models = sorted({s.model for s in timeline})
    color = {m: _PALETTE[i % len(_PALETTE)] for i, m in enumerate(models)}
    rows = []
    y = top
    for node, index, arch in gpus:
        segs = [s for s in timeline if s.node == node and s.gpu_index == index]
        placed = _lanes(segs)
        n_lanes = max((lane for _, lane in placed), default=0) + 1
        height = n_lanes * lane_h
        rows.append(f'<text x="5" y="{y + height / 2 + 4:.1f}" font-size="11">'
                    f'{html.escape(node)}:{index} {html.escape(arch)}</text>')
        rows.append(f'<rect x="{left}" y="{y}" width="{width - left - 20}" height="{height}" '
                    'fill="#f4f4f4"/>')
        for s, lane in placed:
            fill = "#333" if s.outcome == "PROFILE" else color[s.model]
            opacity = "0.35" if s.outcome in ("LOST", "KILLED") else "1"
            rows.append(
                f'<rect x="{left + s.start_s * scale:.2f}" y="{y + lane * lane_h}" '
                f'width="{max(0.5, (s.end_s - s.start_s) * scale):.2f}" height="{lane_h - 1}" '
                f'fill="{fill}" fill-opacity="{opacity}"><title>{html.escape(s.trial_id)} '
                f'{s.outcome} {s.start_s:.0f}-{s.end_s:.0f} s</title></rect>')
        y += height + gap
    legend_y = y + 10
    for i, m in enumerate(models):
        x = left + i * 130
        rows.append(f'<rect x="{x}" y="{legend_y}" width="12" height="12" fill="{color[m]}"/>'
                    f'<text x="{x + 16}" y="{legend_y + 11}" font-size="11">'
                    f'{html.escape(m)}</text>')
    height = legend_y + 30
    axis = f'<text x="{left}" y="{top - 8}" font-size="11">0 s</text>' \
           f'<text x="{width - 90}" y="{top - 8}" font-size="11">{makespan_s:.0f} s</text>'
    head = f'<text x="5" y="18" font-size="14">{html.escape(title)}</text>'
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif">{head}{axis}{"".join(rows)}</svg>\n')
