"""`hypersack profiles`: the Sampler's history, estimated demand against what trials
showed, and its import and export, on a running server or directly on a database."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from hypersack.cli.connect import add_server_flag, connect
from hypersack.cli.control import make_console
from hypersack.cli.text import json_text, print_table, safe
from hypersack.core.errors import InvalidInput
from hypersack.core.types import Profile
from hypersack.sampler.profiles import (
    dump_profiles,
    load_profiles,
    profile_owner,
    select_profiles,
    to_import,
)
from hypersack.store.sqlite import SqliteStore, locked_store
from hypersack.wire.convert import profile_from_pb, profile_to_pb


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "profiles", help="the profile history: list (estimated vs observed), import, export",
        description="The Sampler's history: one profile per workload (model, batch size, "
                    "optimizer, precision, fusion width) and GPU architecture. A listing "
                    "shows the demand the policy uses next to the largest peaks that trials "
                    "showed while running (observed), and why a demand was corrected.")
    p.add_argument("action", nargs="?", choices=["list", "export", "import", "forget"],
                   default="list")
    p.add_argument("file", nargs="?",
                   help="export: where to write (.yaml or .csv, '-' for stdout); import: the "
                        "file to read (as `hypersack-server --profiles` reads); forget: the "
                        "workload whose profiles and failures to forget (with --arch: there)")
    p.add_argument("--model", default="", help="only this model")
    p.add_argument("--arch", default="", help="only this GPU architecture")
    p.add_argument("--format", choices=["table", "csv", "yaml", "json"], default="table",
                   help="list: output format (default table)")
    p.add_argument("--replace", action="store_true",
                   help="import: replace profiles the history has (default: keep them)")
    p.add_argument("--db", type=Path,
                   help="work on this database directly instead of a server (for example "
                        ".hypersack/run.db after `hypersack run`); not while a server uses it")
    add_server_flag(p)


def run_profiles(args: argparse.Namespace) -> int:
    if args.action in ("export", "import", "forget") and not args.file:
        raise InvalidInput(f"profiles {args.action}: give a file")
    if args.db is not None and not args.db.exists():
        raise InvalidInput(f"database {str(args.db)!r} does not exist")
    if args.action == "forget":
        n = _forget(args, args.file, args.arch)
        print(f"forgot {n} profile(s) or failure(s) of {args.file}: its next study profiles "
              "it again")
        return 0
    if args.action == "import":
        imported = load_profiles(args.file)
        done, kept = _import(args, imported)
        print(f"imported {done} profiles from {args.file}"
              + (f"; kept {kept} the history had (--replace to overwrite)" if kept else ""))
        return 0
    profiles = _list(args)
    if args.action == "export":
        fmt = "csv" if str(args.file).endswith(".csv") else "yaml"
        text = dump_profiles(profiles, fmt)
        if args.file == "-":
            sys.stdout.write(text)
        else:
            Path(args.file).write_text(text)
            print(f"exported {len(profiles)} profiles to {args.file}")
        return 0
    if args.format in ("csv", "yaml"):
        sys.stdout.write(dump_profiles(profiles, args.format))
    elif args.format == "json":
        print(json_text([{**p.model_dump(), "owner": profile_owner(p)} for p in profiles]))
    else:
        print_profiles(profiles)
    return 0


def _list(args: argparse.Namespace) -> list[Profile]:
    if args.db is not None:
        store = SqliteStore(args.db)
        try:
            return select_profiles(store.list_profiles(), args.model, args.arch)
        finally:
            store.close()
    with connect(args) as client:
        return [profile_from_pb(msg, where=f"server profile {i}")
                for i, msg in enumerate(client.profiles(args.model, args.arch))]


def _forget(args: argparse.Namespace, model: str, arch: str) -> int:
    if args.db is None:
        with connect(args) as client:
            return client.forget_profiles(model, arch)
    with locked_store(args.db) as store:
        gone = [p for p in store.list_profiles()
                if p.key.model == model and (not arch or p.arch == arch)]
        if not gone:
            raise InvalidInput(f"{args.db}: no profile of workload {model!r}"
                               + (f" on {arch}" if arch else ""))
        with store.transaction():
            for p in gone:
                store.remove_profile(p.key, p.arch)
        return len(gone)


def _import(args: argparse.Namespace, profiles: list[Profile]) -> tuple[int, int]:
    if args.db is None:
        with connect(args) as client:
            return client.import_profiles([profile_to_pb(p) for p in profiles], args.replace)
    with locked_store(args.db) as store:
        known = {(p.key, p.arch) for p in store.list_profiles()}
        new = to_import(profiles, known, args.replace)
        with store.transaction():
            for p in new:
                store.put_profile(p)
    return len(new), len(profiles) - len(new)


def print_profiles(profiles: list[Profile]) -> None:
    console = make_console()
    if not profiles:
        console.print("no profiles yet: they are measured when a study first uses a workload")
        return
    table = Table(title=f"{len(profiles)} profiles: demand (what the policy packs) vs observed "
                        "(largest single-trial peak)")
    text = ("workload", "arch", "owner", "source", "corrected", "measured")
    for col in ("workload", "arch", "owner", "source", "compute %", "obs %", "memory MiB",
                "obs MiB", "cores", "ms/iter", "data %", "epoch s", "trials", "measured",
                "corrected"):
        table.add_column(col, justify="left" if col in text else "right")
    for p in profiles:
        d = p.demand
        over_mem = p.observed_memory_mib > d.memory_mib
        table.add_row(
            safe(p.key.label()), safe(p.arch), safe(profile_owner(p)), safe(p.source),
            f"{d.compute_pct:.1f}",
            f"{p.observed_compute_pct:.1f}" if p.observed_compute_pct else "-",
            str(d.memory_mib),
            (f"[red]{p.observed_memory_mib}[/]" if over_mem else str(p.observed_memory_mib))
            if p.observed_memory_mib else "-",
            f"{d.cores:g}", f"{p.iter_time_s * 1000:.1f}", f"{100 * p.data_fraction:.0f}",
            f"{p.epoch_time_s():.1f}", str(p.observed_trials),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(p.measured_at))
            if p.measured_at else "estimate",
            safe(p.corrected))
    print_table(console, table)
