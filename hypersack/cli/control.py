"""Commands that talk to a running server: submit, status, watch, cancel, nodes, drain,
results, logs."""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import sys
from pathlib import Path
from typing import Any, Protocol

from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.client import Client, params_of
from hypersack.cli.connect import add_server_flag, connect
from hypersack.cli.text import escaped, json_text, safe, safe_log
from hypersack.core.errors import InvalidInput
from hypersack.core.types import TrialState
from hypersack.grid.space import read_space_file

STATE_STYLE = {"PENDING": "dim", "PROFILING": "cyan", "RUNNING": "yellow",
               "COMPLETED": "green", "FAILED": "bold red", "DIVERGED": "red",
               "CANCELLED": "magenta", "PAUSED": "blue", "PRUNED": "dim green"}
TERMINAL = tuple(s.value for s in TrialState if s.terminal)
TABLE_ROWS = 20  # the results table's default length


def exit_code(study: pb.Study) -> int:
    """0 for a COMPLETED study (some trials may have failed: it says so), 1 otherwise."""
    return 0 if study.state == "COMPLETED" else 1


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("submit", help="submit a search space to the server as a new study")
    p.add_argument("space", help="search-space file (YAML or JSON)")
    p.add_argument("--watch", action="store_true", help="then follow it until it ends")
    add_server_flag(p)

    p = sub.add_parser("status", help="studies, or one study's trials (the Grid), coloured")
    p.add_argument("study", nargs="?", help="study id (default: list every study)")
    p.add_argument("--all", action="store_true", help="show every trial, not the first 40")
    _db_flag(p)
    add_server_flag(p)

    p = sub.add_parser("watch", help="follow a study live: done / running / pending, occupancy")
    p.add_argument("study")
    add_server_flag(p)

    p = sub.add_parser("cancel", help="cancel a study: kill its running trials, drop the rest")
    p.add_argument("study")
    add_server_flag(p)

    p = sub.add_parser("nodes", help="nodes and GPUs: connection, trials, occupancy")
    add_server_flag(p)

    p = sub.add_parser("drain", help="stop placing trials on a node; running ones finish")
    p.add_argument("node")
    add_server_flag(p)

    p = sub.add_parser("undrain", help="place trials on a drained node again")
    p.add_argument("node")
    add_server_flag(p)

    p = sub.add_parser("results", help="a study's trials, best objective first")
    p.add_argument("study")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument("--top", type=int, help="only the best N (default: all; the table "
                   "shows the best 20)")
    p.add_argument("--wide", action="store_true", help="a column per parameter, and the "
                   "rank and tries (the default fits 80 columns)")
    _db_flag(p)
    add_server_flag(p)

    p = sub.add_parser("why", help="why a trial waits: what blocks it on each GPU, and what "
                       "holds its study back (trials ahead, share, quota, priority)")
    p.add_argument("trial")
    add_server_flag(p)

    p = sub.add_parser("logs", help="a trial's state, failure reason and the tail of its log")
    p.add_argument("trial")
    _db_flag(p)
    add_server_flag(p)


def _db_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=Path, help="read a database file instead of asking a "
                   "server (after `hypersack run`: .hypersack/run.db)")


class Reader(Protocol):
    """What reading commands need: a server's Client, or a database file's StoreReader."""

    def study(self, study_id: str) -> pb.Study: ...
    def studies(self) -> list[pb.Study]: ...
    def trials(self, study_id: str) -> list[pb.Trial]: ...
    def trial(self, trial_id: str) -> pb.Trial: ...


def make_console() -> Console:
    """The terminal's width (or $COLUMNS); 160 columns into a file or a pipe."""
    return Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160)


def run_control(args: argparse.Namespace) -> int:
    console = make_console()
    if getattr(args, "db", None) is not None:
        from hypersack.cli.offline import StoreReader

        with StoreReader(args.db) as reader:
            if args.command == "status":
                return _status(reader, args, console)
            if args.command == "results":
                print_results(reader, args.study, args.format, args.top, console, args.wide)
                return 0
            return _logs(reader, args.trial, console)
    with connect(args) as client:
        cmd = args.command
        if cmd == "submit":
            return _submit(client, args, console)
        if cmd == "status":
            return _status(client, args, console)
        if cmd == "watch":
            return exit_code(watch(client, args.study, console))
        if cmd == "cancel":
            study = client.cancel(args.study)
            console.print(f"{safe(study.id)}: {safe(study.state)}")
            return 0
        if cmd == "nodes":
            print_nodes(client.nodes(), console)
            return 0
        if cmd == "drain":
            node = client.drain(args.node)
            console.print(f"{safe(node.name)}: draining (no new trials; running ones finish)")
            return 0
        if cmd == "undrain":
            node = client.undrain(args.node)
            console.print(f"{safe(node.name)}: takes new trials again")
            return 0
        if cmd == "results":
            print_results(client, args.study, args.format, args.top, console, args.wide)
            return 0
        if cmd == "why":
            for line in client.explain(args.trial).lines:
                console.print(safe(line), highlight=False)
            return 0
        if cmd == "logs":
            return _logs(client, args.trial, console)
    raise InvalidInput(f"unknown command {args.command}")


def as_shown(value: object) -> str:
    """A parameter in a table: floats to 6 significant digits (TPE proposes 17), the
    rest as they are; CSV and JSON keep every digit."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _submit(client: Client, args: argparse.Namespace, console: Console) -> int:
    path = Path(args.space)
    if not path.exists():
        raise InvalidInput(f"search space file {args.space!r} does not exist")
    study = client.submit(read_space_file(path), str(path))
    now = sum(study.counts.values())
    planned = max(study.planned, now)
    asked = f" ({planned - now} asked of its sampler as capacity frees)" \
        if planned > now else ""
    console.print(f"submitted {safe(study.id)}: {planned} trials{asked}")
    if args.watch:
        return exit_code(watch(client, study.id, console))
    return 0


def _state(state: str) -> str:
    return f"[{STATE_STYLE[state]}]{state}[/]" if state in STATE_STYLE else safe(state)


def _counts_line(counts: Any) -> str:
    parts = [f"[{STATE_STYLE[s]}]{s.lower()} {counts.get(s, 0)}[/]" for s in STATE_STYLE
             if counts.get(s, 0)]
    return ", ".join(parts) or "no trials"


def _status(client: Reader, args: argparse.Namespace, console: Console) -> int:
    if not args.study:
        studies = client.studies()
        if not studies:
            console.print("no studies")
            return 0
        table = Table("study", "state", "trials")
        for s in studies:
            table.add_row(safe(s.id), safe(s.state), _counts_line(s.counts))
        console.print(table)
        return 0
    study = client.study(args.study)
    trials = client.trials(args.study)
    console.print(f"{safe(study.id)} \\[{safe(study.state)}]: {_counts_line(study.counts)}")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("trial", no_wrap=True)  # never cut: it is copied into `logs`
    table.add_column("state", no_wrap=True)
    table.add_column("params")
    table.add_column("where", no_wrap=True)
    table.add_column("tries", no_wrap=True)
    table.add_column("objective", no_wrap=True)
    shown = trials if args.all else trials[:40]
    for t in shown:
        params = safe(" ".join(f"{k}={as_shown(v)}" for k, v in params_of(t).items()))
        where = safe(f"{t.node}:{t.gpu_index}") if t.node else ""
        table.add_row(safe(t.id), _state(t.state), params, where,
                      str(t.launches), f"{t.objective:.6g}" if t.has_objective else "")
    console.print(table)
    if len(shown) < len(trials):
        console.print(f"... {len(trials) - len(shown)} more (--all)")
    return 0


def watch(client: Client, study_id: str, console: Console) -> pb.Study:
    """A live progress bar until the study ends; returns its last state."""
    last: pb.Study | None = None
    columns = (TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[detail]}"),
               TimeElapsedColumn())
    first = client.study(study_id)  # the total from the start, not "0/None"
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(safe(study_id),
                                 total=max(first.planned, sum(first.counts.values())) or None,
                                 completed=sum(first.counts.get(k, 0) for k in TERMINAL),
                                 detail="")
        for update in client.watch(study_id):
            s = update.study
            last = s
            done = sum(s.counts.get(k, 0) for k in TERMINAL)
            total = max(s.planned, sum(s.counts.values()))
            shares = [g.compute_share for g in update.gpus]
            occupancy = sum(shares) / len(shares) if shares else 0.0
            early = (f", paused {s.counts.get('PAUSED', 0)}, pruned "
                     f"{s.counts.get('PRUNED', 0)}") if any(
                s.counts.get(k) for k in ("PAUSED", "PRUNED")) else ""
            detail = (f"running {s.counts.get('RUNNING', 0)}, pending "
                      f"{s.counts.get('PENDING', 0) + s.counts.get('PROFILING', 0)}{early}, "
                      f"failed {s.counts.get('FAILED', 0)}; occupancy now {occupancy:.0%} of "
                      f"{len(shares)} devices")
            progress.update(task, completed=done, total=total, detail=detail)
    if last is None:
        last = client.study(study_id)
    console.print(f"{safe(last.id)}: {safe(last.state)}, {_counts_line(last.counts)}")
    print_outcome(last, console)
    return last


def print_outcome(study: pb.Study, console: Console) -> None:
    """What a person must not miss: trials that did not complete, and the warnings."""
    total = sum(study.counts.values())
    bad = sum(study.counts.get(k, 0) for k in ("FAILED", "DIVERGED"))
    if study.state == "FAILED":
        console.print(f"[bold red]{safe(study.id)} failed: none of its {total} trials "
                      "completed[/] (hypersack logs TRIAL says why)")
    elif bad:
        console.print(f"[red]{bad} of {total} trials did not complete[/] (failed or "
                      "diverged: hypersack logs TRIAL)")
    for warning in study.warnings:
        console.print(f"[yellow]warning:[/] {safe(warning)}")


def print_nodes(nodes: list[pb.Node], console: Console) -> None:
    if not nodes:
        console.print("no nodes registered")
        return
    table = Table("node", "backend", "state", "last seen", "GPU", "arch", "memory", "trials",
                  "occupancy", "util", "sharing")
    for n in nodes:
        state = ("connected" if n.connected else "[red]disconnected[/]") + (
            ", [yellow]draining[/]" if n.draining else "")
        for i, g in enumerate(n.gpus):
            head = (safe(n.name), safe(n.backend), state, f"{n.last_seen_s:.1f} s ago") \
                if i == 0 else ("", "", "", "")
            sharing = safe(g.sharing or "-") + (f" ({g.mps_restarts} restarts)"
                                                 if g.mps_restarts else "")
            table.add_row(*head, str(g.index), safe(g.arch), f"{g.memory_mib} MiB", str(g.trials),
                          f"{g.compute_share:.0%}", f"{g.utilization_pct:.0f}%", sharing)
    console.print(table)


def ranked(study: pb.Study, trials: list[pb.Trial]) -> list[pb.Trial]:
    """Best objective first (the study's mode); trials without one after, by id."""
    sign = -1.0 if study.objective_mode == "max" else 1.0

    def key(t: pb.Trial) -> tuple[int, float, str]:
        if t.has_objective and not math.isnan(t.objective):
            return (0, sign * t.objective, t.id)
        return (1, 0.0, t.id)

    return sorted(trials, key=key)


def print_results(client: Reader, study_id: str, fmt: str, top: int | None,
                  console: Console, wide: bool = False) -> None:
    study = client.study(study_id)
    trials = ranked(study, client.trials(study_id))
    total = len(trials)
    if top is None and fmt == "table":
        top = TABLE_ROWS  # csv and json give every trial unless told
    if top is not None:
        trials = trials[:max(0, top)]
    names = sorted({k for t in trials for k in params_of(t)})
    metrics = sorted({k for t in trials for k in t.metrics})
    rows = []
    for t in trials:
        p = params_of(t)
        rows.append({"trial": t.id, "state": t.state,
                     "objective": t.objective if t.has_objective else None,
                     **{k: p.get(k) for k in names},
                     **{f"metric.{k}": t.metrics.get(k) for k in metrics},
                     "tries": t.launches, "reason": t.reason})
    if fmt == "json":
        sys.stdout.write(json_text({
            "study": study.id, "state": study.state,
            "objective": {"metric": study.objective_metric, "mode": study.objective_mode},
            "trials": rows}) + "\n")
        return
    if fmt == "csv":
        buf = io.StringIO()
        rows = [{escaped(k): escaped(v) if isinstance(v, str) else v for k, v in r.items()}
                for r in rows]
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["trial"])
        writer.writeheader()
        writer.writerows(rows)
        sys.stdout.write(buf.getvalue())
        return
    console.print(f"{safe(study.id)} \\[{safe(study.state)}]: {_counts_line(study.counts)}; "
                  f"objective {safe(study.objective_metric)} ({safe(study.objective_mode)}), "
                  "best first")
    # The id, state and objective are never cut (an id is copied into `logs`); the
    # parameters share one column that wraps, unless --wide gives each its own.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    if wide:
        table.add_column("#", no_wrap=True, justify="right")
    table.add_column("trial", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column(safe(study.objective_metric), no_wrap=True)
    for k in names if wide else ["parameters"]:
        table.add_column(safe(k), overflow="fold")
    if wide:
        table.add_column("tries", no_wrap=True)
    for i, t in enumerate(trials, 1):
        p = params_of(t)
        values = ([safe(as_shown(p.get(k, ""))) for k in names] if wide
                  else [safe(" ".join(f"{k}={as_shown(p[k])}" for k in names if k in p))])
        objective = f"{t.objective:.6g}" if t.has_objective else ""
        if wide:
            table.add_row(str(i), safe(t.id), _state(t.state), objective, *values,
                          str(t.launches))
        else:
            table.add_row(safe(t.id), _state(t.state), objective, *values)
    console.print(table)
    if len(trials) < total:
        console.print(f"best {len(trials)} of {total} (--top N for more, --format csv for "
                      "all)")


def _logs(client: Reader, trial_id: str, console: Console) -> int:
    t = client.trial(trial_id)
    where = safe(f" on {t.node}:{t.gpu_index}") if t.node else ""
    console.print(f"{safe(t.id)} {_state(t.state)}{where}, launched "
                  f"{t.launches} time(s), failures {t.failures}")
    if t.reason:
        console.print(f"reason: {safe(t.reason)}")
    if t.log_tail:
        console.print("--- log tail ---", style="dim")
        tail = safe_log(t.log_tail)
        sys.stdout.write(tail if tail.endswith("\n") else tail + "\n")
    elif t.state == "RUNNING":
        console.print("running: its log is in the agent's work directory on that node "
                      f"(<workdir>/{safe(t.node)}/{safe(t.study_id)}/{safe(t.id)}/"
                      f"attempt-{t.launches}/log.txt)")
    else:
        console.print("no log recorded")
    return 0
