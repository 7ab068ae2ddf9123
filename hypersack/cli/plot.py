"""`hypersack plot STUDY --out FILE`: a study's pictures from what the server recorded.

Three panels, one figure (SVG or PNG by the file's suffix):
  1. learning curves: the objective per epoch of every trial, the best drawn bold,
     pruned trials ending in an x, failed and diverged ones in red;
  2. the real Gantt: each attempt's span on its GPU (recorded launch to end), trials
     sharing a GPU stacked in its row, fused groups hatched;
  3. occupancy: trials running on each GPU over time.

Every drawn element carries an id (`curve:TRIAL`, `pruned:TRIAL`, `span:TRIAL:ATTEMPT`,
`occupancy:NODE:GPU`), so an SVG can be checked and styled. Needs matplotlib (the
`plot` extra)."""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from pathlib import Path

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.core.errors import HyperSackError, InvalidInput

FORMATS = (".svg", ".png")
STATE_COLOR = {"PRUNED": "#9e9e9e", "FAILED": "#d62728", "DIVERGED": "#d62728",
               "CANCELLED": "#bcbcbc"}


def lanes(spans: list[pb.Span]) -> dict[tuple[str, int], list[tuple[pb.Span, int]]]:
    """Per GPU, each span with a lane: spans that overlap in time get different lanes
    (the lowest free one), so trials packed on one GPU stack in its row."""
    out: dict[tuple[str, int], list[tuple[pb.Span, int]]] = defaultdict(list)
    for s in sorted(spans, key=lambda s: (s.start, s.trial_id, s.attempt)):
        row = out[(s.node, s.gpu_index)]
        busy = {lane for other, lane in row if other.end > s.start}
        row.append((s, next(i for i in range(len(row) + 1) if i not in busy)))
    return dict(out)


def occupancy(spans: list[tuple[pb.Span, int]], t0: float) -> tuple[list[float], list[int]]:
    """Trials running on one GPU over time, as step points (seconds from t0)."""
    edges = sorted([(s.start - t0, 1) for s, _ in spans] + [(s.end - t0, -1) for s, _ in spans])
    xs, ys, running = [0.0], [0], 0
    for x, delta in edges:
        running += delta
        if xs[-1] == x:  # events at one instant: one step (an end and a start, no dip)
            ys[-1] = running
        else:
            xs.append(x)
            ys.append(running)
    return xs, ys


def plot_study(study: pb.Study, trials: list[pb.Trial], history: pb.History,
               out: Path) -> dict[str, int]:
    """Draw the study into `out`; returns what was drawn (curves, pruned, spans, gpus)."""
    if out.suffix.lower() not in FORMATS:
        raise InvalidInput(f"--out {str(out)!r}: the file's suffix says the format, one of "
                           f"{', '.join(FORMATS)}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise HyperSackError("hypersack plot needs matplotlib: pip install "
                             "'hypersack[plot]' (or pip install matplotlib)") from None
    objective = study.objective_metric
    state = {t.id: t.state for t in trials}
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for h in history.steps:
        value = h.metrics.get(objective)
        if value is not None and math.isfinite(value):
            curves[h.trial_id].append((int(h.step), float(value)))
    sign = -1.0 if study.objective_mode == "max" else 1.0
    done = [t for t in trials if t.has_objective and math.isfinite(t.objective)]
    best = min(done, key=lambda t: sign * t.objective).id if done else ""
    per_gpu = lanes(list(history.spans))
    t0 = min((s.start for s in history.spans), default=0.0)
    drawn = {"curves": 0, "pruned": 0, "spans": 0, "gpus": len(per_gpu)}

    with plt.rc_context({"svg.fonttype": "none", "font.size": 9}):
        fig, (ax_c, ax_g, ax_o) = plt.subplots(
            3, 1, figsize=(11, 12), gridspec_kw={"height_ratios": [3, 3, 1.4]})
        fig.suptitle(f"{study.id}: {study.state}, objective {objective} "
                     f"({study.objective_mode})")
        cmap = plt.get_cmap("viridis")
        ids = sorted(curves)
        for i, tid in enumerate(ids):
            points = sorted(curves[tid])
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            color = STATE_COLOR.get(state.get(tid, ""), cmap(i / max(1, len(ids) - 1)))
            (line,) = ax_c.plot(xs, ys, color=color, linewidth=2.6 if tid == best else 1.0,
                                alpha=1.0 if tid == best else 0.75, marker=".",
                                markersize=3, label=f"best: {tid}" if tid == best else None)
            line.set_gid(f"curve:{tid}")
            drawn["curves"] += 1
            if state.get(tid) == "PRUNED":
                (mark,) = ax_c.plot(xs[-1:], ys[-1:], marker="x", color="black",
                                    markersize=7, linestyle="none")
                mark.set_gid(f"pruned:{tid}")
                drawn["pruned"] += 1
        ax_c.set_xlabel("epoch")
        ax_c.set_ylabel(objective)
        ax_c.set_title(f"learning curves: {drawn['curves']} trials, {drawn['pruned']} "
                       "pruned (x), failed or diverged in red")
        if best:
            ax_c.legend(loc="best")
        ax_c.grid(alpha=0.3)

        rows = sorted(per_gpu)
        for r, gpu in enumerate(rows):
            placed = per_gpu[gpu]
            depth = max(lane for _, lane in placed) + 1
            for s, lane in placed:
                height = 0.8 / depth
                y = r - 0.4 + lane * height
                bars = ax_g.broken_barh(
                    [(s.start - t0, max(s.end - s.start, 1e-3))], (y, height * 0.92),
                    facecolors=STATE_COLOR.get(state.get(s.trial_id, ""),
                                               cmap((zlib.crc32(s.trial_id.encode()) % 97) / 96)),
                    edgecolor="black", linewidth=0.3, hatch="//" if s.group else None)
                bars.set_gid(f"span:{s.trial_id}:{s.attempt}")
                drawn["spans"] += 1
            ox, oy = occupancy(placed, t0)
            (step,) = ax_o.step(ox, oy, where="post", label=f"{gpu[0]}:{gpu[1]}")
            step.set_gid(f"occupancy:{gpu[0]}:{gpu[1]}")
        ax_g.set_yticks(range(len(rows)), [f"{n}:{g}" for n, g in rows])
        ax_g.set_xlabel("seconds since the first launch")
        ax_g.set_title(f"where each attempt ran: {drawn['spans']} spans on {len(rows)} "
                       "GPUs (stacked: sharing a GPU; hatched: a fused group)")
        ax_g.grid(axis="x", alpha=0.3)
        ax_o.set_xlabel("seconds since the first launch")
        ax_o.set_ylabel("trials running")
        ax_o.set_title("occupancy per GPU")
        if len(rows) <= 12:
            ax_o.legend(loc="upper right", fontsize=7)
        ax_o.grid(alpha=0.3)
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
        plt.close(fig)
    return drawn

