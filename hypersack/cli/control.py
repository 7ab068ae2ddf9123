"""Commands that talk to a running server: submit, status, watch, cancel, nodes, drain,
results, logs."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.client import Client, params_of
from hypersack.cli.connect import add_server_flag, connect
from hypersack.cli.results import (
    Reader,
    as_shown,
    counts_line,
    print_logs,
    print_results,
    state_text,
)
from hypersack.cli.text import print_table, safe
from hypersack.core.bounds import MAX_EXTEND
from hypersack.core.errors import InvalidInput
from hypersack.core.types import TrialState
from hypersack.grid.space import read_space_file
from hypersack.orchestrator.levels import SharingLevel, WorkloadFit

TERMINAL = tuple(s.value for s in TrialState if s.terminal)
EXIT_CODES = ("exit status: 0 when the study completed and every trial completed (or was "
              "pruned by its pruner); 3 when the study completed but some trials failed or "
              "diverged; 1 when the study failed or was cancelled (or an error stopped "
              "this command); 2 for bad arguments; 130 when interrupted.")
NOT_COMPLETED = ("FAILED", "DIVERGED", "CANCELLED")


def exit_code(study: pb.Study) -> int:
    """What a script reads of a study's end (see EXIT_CODES)."""
    if study.state != "COMPLETED":
        return 1
    return 3 if any(study.counts.get(s, 0) for s in NOT_COMPLETED) else 0


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("submit", help="submit a search space to the server as a new study",
                       epilog="With --watch, " + EXIT_CODES)
    p.add_argument("space", help="search-space file (YAML or JSON)")
    p.add_argument("--watch", action="store_true", help="then follow it until it ends")
    add_server_flag(p)

    p = sub.add_parser("status", help="studies, or one study's trials (the Grid), coloured")
    p.add_argument("study", nargs="?", help="study id (default: list every study)")
    p.add_argument("--all", action="store_true", help="show every trial, not the first 40")
    _db_flag(p)
    add_server_flag(p)

    p = sub.add_parser("watch", help="follow a study live: done / running / pending, occupancy",
                       epilog=EXIT_CODES)
    p.add_argument("study")
    add_server_flag(p)

    p = sub.add_parser(
        "extend", help="add trials to a study of adaptive or random search, active or ended",
        description="Add trials to a study whose search is optuna, manual or random, "
                    "whether it still runs or has ended: its sampler goes on with every "
                    "trial it was told (as study.optimize again in Optuna), and the study is "
                    "active until the new trials end. A grid has all its points already.",
        epilog="With --watch, " + EXIT_CODES)
    p.add_argument("study")
    p.add_argument("--trials", type=_extension, required=True,
                   help=f"how many trials to add (1 to {MAX_EXTEND})")
    p.add_argument("--watch", action="store_true", help="then follow it until it ends")
    add_server_flag(p)

    p = sub.add_parser("cancel", help="cancel a study: kill its running trials, drop the rest")
    p.add_argument("study")
    add_server_flag(p)

    p = sub.add_parser("nodes", help="nodes and GPUs: connection, trials, occupancy; how "
                       "far each GPU architecture is packed (configured or learned)")
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

    p = sub.add_parser(
        "plot", help="draw a study: learning curves, where each attempt ran, occupancy",
        description="One figure of three panels from what the server recorded: the "
                    "objective per epoch of every trial (the best bold, pruned ones ending "
                    "in an x, failed ones red), the real Gantt (each attempt's span on its "
                    "GPU, trials sharing a GPU stacked, fused groups hatched) and the trials "
                    "running on each GPU over time. Needs matplotlib: pip install "
                    "'hypersack[plot]'.")
    p.add_argument("study")
    p.add_argument("--out", type=Path, required=True,
                   help="the picture to write: FILE.svg or FILE.png")
    _db_flag(p)
    add_server_flag(p)

    p = sub.add_parser(
        "export", help="write a study into an Optuna storage (optuna-dashboard, "
                       "optuna.visualization)",
        description="Write the study into an Optuna storage, so that optuna-dashboard and "
                    "optuna.visualization work on it unchanged: each trial with its "
                    "parameters and the space's distributions, its state, objective, "
                    "learning curve (intermediate values), start and end, and user "
                    "attributes (HyperSack trial id and state, node, GPU, attempts, fused "
                    "group, metrics, reason). Needs optuna.")
    p.add_argument("study")
    p.add_argument("--optuna", required=True, metavar="STORAGE_URL",
                   help="an Optuna RDB storage, e.g. sqlite:///optuna.db")
    p.add_argument("--name", default="", help="the Optuna study's name (default: the "
                   "study id)")
    p.add_argument("--replace", action="store_true", help="rewrite an Optuna study of that "
                   "name exported from this study before")
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


def make_console() -> Console:
    """The terminal's width (or $COLUMNS); 160 columns into a file or a pipe."""
    return Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160)


def _extension(text: str) -> int:
    """`extend --trials`: a whole number of trials, 1 to MAX_EXTEND."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: a whole number of trials") from None
    if not 1 <= n <= MAX_EXTEND:
        raise argparse.ArgumentTypeError(f"{n}: extend by 1 to {MAX_EXTEND} trials")
    return n


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
            if args.command == "plot":
                return _plot(reader, args, console)
            if args.command == "export":
                return _export(reader, args, console)
            return print_logs(reader, args.trial, console)
    with connect(args) as client:
        cmd = args.command
        if cmd == "submit":
            return _submit(client, args, console)
        if cmd == "status":
            return _status(client, args, console)
        if cmd == "watch":
            return exit_code(watch(client, args.study, console))
        if cmd == "extend":
            study = client.extend(args.study, args.trials)
            planned = max(study.planned, sum(study.counts.values()))
            console.print(f"{safe(study.id)}: {safe(study.state)}, {planned} trials in all")
            return exit_code(watch(client, study.id, console)) if args.watch else 0
        if cmd == "cancel":
            study = client.cancel(args.study)
            console.print(f"{safe(study.id)}: {safe(study.state)}")
            return 0
        if cmd == "nodes":
            listing = client.cluster()
            print_nodes(list(listing.nodes), console)
            print_sharing(list(listing.sharing), console)
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
        if cmd == "plot":
            return _plot(client, args, console)
        if cmd == "export":
            return _export(client, args, console)
        if cmd == "why":
            for line in client.explain(args.trial).lines:
                console.print(safe(line), highlight=False)
            return 0
        if cmd == "logs":
            return print_logs(client, args.trial, console)
    raise InvalidInput(f"unknown command {args.command}")


def _plot(client: Reader, args: argparse.Namespace, console: Console) -> int:
    from hypersack.cli.plot import plot_study

    study = client.study(args.study)
    drawn = plot_study(study, client.trials(study.id), client.history(study_id=study.id),
                       args.out)
    console.print(f"{safe(str(args.out))}: {drawn['curves']} learning curves "
                  f"({drawn['pruned']} pruned), {drawn['spans']} spans on {drawn['gpus']} "
                  "GPUs")
    return 0


def _export(client: Reader, args: argparse.Namespace, console: Console) -> int:
    from hypersack.cli.export import export_optuna

    counts = export_optuna(client, args.study, args.optuna, name=args.name,
                           replace=args.replace)
    console.print(f"{safe(args.study)} -> {safe(args.optuna)} as "
                  f"{safe(args.name or args.study)}: {sum(counts.values())} trials ("
                  + ", ".join(f"{k.lower()} {v}" for k, v in sorted(counts.items())) + ")")
    return 0


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


def _status(client: Reader, args: argparse.Namespace, console: Console) -> int:
    if not args.study:
        studies = client.studies()
        if not studies:
            console.print("no studies")
            return 0
        table = Table("study", "state", "trials")
        for s in studies:
            table.add_row(safe(s.id), safe(s.state), counts_line(s.counts))
        console.print(table)
        return 0
    study = client.study(args.study)
    trials = client.trials(args.study)
    console.print(f"{safe(study.id)} \\[{safe(study.state)}]: {counts_line(study.counts)}")
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
        table.add_row(safe(t.id), state_text(t.state), params, where,
                      str(t.launches), f"{t.objective:.6g}" if t.has_objective else "")
    print_table(console, table)
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
    console.print(f"{safe(last.id)}: {safe(last.state)}, {counts_line(last.counts)}")
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


def print_sharing(levels: list[pb.SharingLevel], console: Console) -> None:
    """How far each architecture is packed: configured, or learned and from what."""
    for lv in levels:
        said = {f.name: getattr(lv, f.name) for f in fields(SharingLevel)}
        own = tuple(WorkloadFit(w.workload, w.samples, w.contention, w.saturation_pct,
                                w.queued or 1.0) for w in lv.workloads)
        level = SharingLevel(**{**said, "queued": lv.queued or 1.0,  # 0: an older server
                                "workloads": own})
        console.print(safe(level.describe()))


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
    print_table(console, table)
