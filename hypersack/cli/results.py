"""A study's results as people and scripts read them: the ranked table (value reached,
epoch, a one-line reason for each trial that did not complete), CSV and JSON with every
digit, and a trial's log."""

from __future__ import annotations

import csv
import io
import math
import re
import sys
from typing import Protocol

from rich import box
from rich.console import Console
from rich.table import Table

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.client import params_of
from hypersack.cli.text import escaped, json_text, print_table, safe, safe_log
from hypersack.core.pareto import front, objective_values

STATE_STYLE = {"PENDING": "dim", "PROFILING": "cyan", "RUNNING": "yellow",
               "COMPLETED": "green", "FAILED": "bold red", "DIVERGED": "red",
               "CANCELLED": "magenta", "PAUSED": "blue", "PRUNED": "dim green"}
TABLE_ROWS = 20  # the results table's default length
NOTED = ("FAILED", "DIVERGED", "PRUNED", "CANCELLED", "PAUSED")  # rows that say why
BRIEF_CHARS = 100
_ASIDE = re.compile(r"\s*\([^()]*\)")


class Reader(Protocol):
    """What reading commands need: a server's Client, or a database file's StoreReader."""

    def study(self, study_id: str) -> pb.Study: ...
    def studies(self) -> list[pb.Study]: ...
    def trials(self, study_id: str) -> list[pb.Trial]: ...
    def trial(self, trial_id: str) -> pb.Trial: ...
    def history(self, *, study_id: str = "", trial_id: str = "") -> pb.History: ...


def state_text(state: str) -> str:
    return f"[{STATE_STYLE[state]}]{state}[/]" if state in STATE_STYLE else safe(state)


def as_shown(value: object) -> str:
    """A parameter in a table: floats to 6 significant digits (TPE proposes 17), the
    rest as they are; CSV and JSON keep every digit."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def brief(t: pb.Trial, limit: int = BRIEF_CHARS) -> str:
    """Why a trial did not complete, in one line: its reason without asides, and the
    last line its log printed (a failure's error) when the reason does not say it."""
    if t.state not in NOTED or not t.reason:
        return ""
    head, sep, tail = t.reason.partition("; log tail: ")
    last = _last_line(tail if sep else t.log_tail if t.state in ("FAILED", "DIVERGED")
                      else "")
    head = _ASIDE.sub("", (head.strip().splitlines() or [""])[0])
    if t.state not in ("FAILED", "DIVERGED"):  # the value reached is in its own column
        head, last = head.split(": ")[0], ""
    text = " ".join((head + (f": {last}" if last and last not in head else "")).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def value_reached(t: pb.Trial) -> float | None:
    """The objective a trial ended with, or the last value it reported (a pruned or
    running trial's)."""
    if t.has_objective and not math.isnan(t.objective):
        return t.objective
    return t.last_value if t.has_last_value else None


def goals(study: pb.Study) -> list[tuple[str, str]]:
    """(metric, mode) of each objective: the one, or the several of a multi-objective
    study."""
    if len(study.objective_metrics) > 1 and \
            len(study.objective_metrics) == len(study.objective_modes):
        return list(zip(study.objective_metrics, study.objective_modes, strict=True))
    return [(study.objective_metric, study.objective_mode)]


def values_of(t: pb.Trial, metrics: list[str]) -> list[float] | None:
    """A trial's value of each objective (`core.pareto.objective_values`)."""
    return objective_values(t.state == "COMPLETED",
                            t.objective if t.has_objective else None, t.metrics, metrics)


def pareto(study: pb.Study, trials: list[pb.Trial]) -> set[str]:
    """The ids of the trials on the Pareto front of a multi-objective study (none for a
    study of one objective)."""
    g = goals(study)
    if len(g) < 2:
        return set()
    points = [values_of(t, [m for m, _ in g]) for t in trials]
    return {trials[i].id for i in front(points, [mode == "max" for _, mode in g])}


def ranked(study: pb.Study, trials: list[pb.Trial], on_front: set[str] | None = None
           ) -> list[pb.Trial]:
    """Best objective first (the study's mode); trials without one after, by id. A
    multi-objective study: its Pareto front first (`on_front`, computed where not
    given), each part by the first objective."""
    sign = -1.0 if study.objective_mode == "max" else 1.0
    if on_front is None:
        on_front = pareto(study, trials)

    def key(t: pb.Trial) -> tuple[int, int, float, str]:
        if t.has_objective and not math.isnan(t.objective):
            return (0, t.id not in on_front, sign * t.objective, t.id)
        return (1, 0, 0.0, t.id)

    return sorted(trials, key=key)


def counts_line(counts: object) -> str:
    get = counts.get  # type: ignore[attr-defined]
    parts = [f"[{STATE_STYLE[s]}]{s.lower()} {get(s, 0)}[/]" for s in STATE_STYLE
             if get(s, 0)]
    return ", ".join(parts) or "no trials"


def print_results(client: Reader, study_id: str, fmt: str, top: int | None,
                  console: Console, wide: bool = False) -> None:
    study = client.study(study_id)
    everything = client.trials(study_id)
    on_front = pareto(study, everything)
    trials = ranked(study, everything, on_front)
    total = len(trials)
    g = goals(study)
    several = len(g) > 1
    if top is None and fmt == "table":
        top = TABLE_ROWS  # csv and json give every trial unless told
    if top is not None:
        trials = trials[:max(0, top)]
    names = sorted({k for t in trials for k in params_of(t)})
    metrics = sorted({k for t in trials for k in t.metrics})
    if fmt in ("json", "csv"):
        rows = []
        for t in trials:
            p = params_of(t)
            rows.append({"trial": t.id, "state": t.state,
                         "objective": t.objective if t.has_objective else None,
                         "epoch": t.epoch or None,
                         "last_value": t.last_value if t.has_last_value else None,
                         **({"values": values_of(t, [m for m, _ in g]),
                             "pareto": t.id in on_front} if several else {}),
                         **{k: p.get(k) for k in names},
                         **{f"metric.{k}": t.metrics.get(k) for k in metrics},
                         "tries": t.launches, "reason": t.reason})
        if fmt == "json":
            sys.stdout.write(json_text({
                "study": study.id, "state": study.state,
                "objective": {"metric": study.objective_metric,
                              "mode": study.objective_mode},
                **({"objectives": [{"metric": m, "mode": mode} for m, mode in g]}
                   if several else {}),
                "trials": rows}) + "\n")
            return
        buf = io.StringIO()
        rows = [{escaped(k): escaped(v) if isinstance(v, str) else v for k, v in r.items()}
                for r in rows]
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["trial"])
        writer.writeheader()
        writer.writerows(rows)
        sys.stdout.write(buf.getvalue())
        return
    if several:
        said = ", ".join(f"{safe(m)} ({safe(mode)})" for m, mode in g)
        console.print(f"{safe(study.id)} \\[{safe(study.state)}]: {counts_line(study.counts)}; "
                      f"objectives {said}; the Pareto front (*) first, "
                      f"{len(on_front)} trial(s)")
    else:
        console.print(f"{safe(study.id)} \\[{safe(study.state)}]: {counts_line(study.counts)}; "
                      f"objective {safe(study.objective_metric)} "
                      f"({safe(study.objective_mode)}), best first")
    notes = [brief(t) for t in trials]
    # The id, state and value are never cut (an id is copied into `logs`); the
    # parameters share one column that wraps, unless --wide gives each its own.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    if wide:
        table.add_column("#", no_wrap=True, justify="right")
    table.add_column("trial", no_wrap=True)
    table.add_column("state", no_wrap=True)
    if several:
        table.add_column("*", no_wrap=True)
    table.add_column(safe(study.objective_metric), no_wrap=True)
    for m, _ in g[1:]:
        table.add_column(safe(m), no_wrap=True)
    table.add_column("epoch", no_wrap=True, justify="right")
    for k in names if wide else ["parameters"]:
        table.add_column(safe(k), overflow="fold")
    if wide:
        table.add_column("tries", no_wrap=True)
    if any(notes):
        table.add_column("why", overflow="fold")
    for i, (t, note) in enumerate(zip(trials, notes, strict=True), 1):
        p = params_of(t)
        values = ([safe(as_shown(p.get(k, ""))) for k in names] if wide
                  else [safe(" ".join(f"{k}={as_shown(p[k])}" for k in names if k in p))])
        value = value_reached(t)
        others = [f"{t.metrics[m]:.6g}" if m in t.metrics else "" for m, _ in g[1:]]
        mark = ["*" if t.id in on_front else ""] if several else []
        row = [safe(t.id), state_text(t.state), *mark,
               "" if value is None else f"{value:.6g}", *others,
               str(t.epoch) if t.epoch else "", *values]
        if wide:
            row = [str(i), *row, str(t.launches)]
        if any(notes):
            row.append(safe(note))
        table.add_row(*row)
    print_table(console, table)
    if len(trials) < total:
        console.print(f"best {len(trials)} of {total} (--top N for more, --format csv for "
                      "all)")


def print_logs(client: Reader, trial_id: str, console: Console) -> int:
    t = client.trial(trial_id)
    where = safe(f" on {t.node}:{t.gpu_index}") if t.node else ""
    console.print(f"{safe(t.id)} {state_text(t.state)}{where}, launched "
                  f"{t.launches} time(s), failures {t.failures}"
                  + (f", reached epoch {t.epoch}" if t.epoch else ""))
    if t.reason:
        console.print(f"reason: {safe(t.reason)}")
    if t.log_tail:
        console.print("--- log tail ---", style="dim")
        tail = safe_log(t.log_tail)
        sys.stdout.write(tail if tail.endswith("\n") else tail + "\n")
    elif t.launches and (t.state == "RUNNING" or t.node):
        console.print("running: its log is in the agent's work directory on that node "
                      f"(<workdir>/{safe(t.node)}/{safe(t.study_id)}/{safe(t.id)}/"
                      f"attempt-{t.launches}/log.txt)")
    elif t.launches:
        console.print("no log came back from its node; there it is under <workdir>/<node>/"
                      f"{safe(t.study_id)}/{safe(t.id)}/attempt-{t.launches}/log.txt")
    else:
        console.print("no log: it never ran")
    return 0
