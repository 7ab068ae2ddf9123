"""`hypersack run SPACE`: an embedded server and a local agent in one process, one study
to the end, then its results. Both talk over real gRPC on loopback."""

from __future__ import annotations

import argparse
import logging
import threading
import time
from pathlib import Path
from typing import Any

from hypersack.agent.agent import Agent
from hypersack.agent.devices import BACKENDS, make_backend
from hypersack.agent.guard import CommandPolicy
from hypersack.cli.client import Client
from hypersack.cli.control import EXIT_CODES, exit_code, make_console, watch
from hypersack.cli.results import print_results
from hypersack.core.errors import HyperSackError
from hypersack.grid.space import load_space, read_space_file
from hypersack.policies.registry import policy_names
from hypersack.server.app import HyperSackServer
from hypersack.wire.settings import ServerSettings


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run", help="run a study on this machine: embedded server plus a local agent",
        description="Start an embedded HyperSack server and a local agent in this process, "
                    "submit the search space, show progress until every trial ends and "
                    "print the results, best first. Without a GPU the CPU is the device. "
                    "The database (<state-dir>/run.db) keeps the profile history, so a "
                    "second run of the same workloads is not profiled again, and the "
                    "results: `hypersack results STUDY --db <state-dir>/run.db`.",
        epilog=EXIT_CODES)
    p.add_argument("space", help="search-space file, e.g. examples/quickstart.yaml")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="auto (NVIDIA GPUs through NVML if present, else the CPU), nvml, "
                        "cpu, or fake with --inventory")
    p.add_argument("--inventory", help="for --backend fake, e.g. 4xA100-80GB@88")
    p.add_argument("--state-dir", type=Path, default=Path(".hypersack"),
                   help="database (run.db) and trial work directories (default .hypersack)")
    p.add_argument("--policy", help="override the study's policy")
    p.add_argument("--profiles", type=Path, action="append", default=[],
                   help="import a profiles file into the history first (repeatable)")
    p.add_argument("--top", type=int, default=10, help="results to print (default 10)")
    p.add_argument("--no-warm-start", dest="warm_start", action="store_false",
                   help="start every trial in a new interpreter (default: Python trials "
                        "fork from a warm process that imported their libraries once)")


AGENT_WAIT_S = 60.0


def run_embedded(args: argparse.Namespace) -> int:
    console = make_console()
    path = Path(args.space)
    space = load_space(path, policy_names())  # fails here, before anything starts, on a bad file
    state = args.state_dir
    state.mkdir(parents=True, exist_ok=True)
    settings = ServerSettings(listen="127.0.0.1:0", db=state / "run.db", policy=args.policy,
                              heartbeat_interval_s=1.0, heartbeat_timeout_s=15.0,
                              tick_interval_s=0.5, profiles=list(args.profiles))
    backend = make_backend(args.backend, inventory=args.inventory, node="local")
    server = HyperSackServer(settings)
    server.start()
    # One's own machine and programs: any command, and the trials see this environment.
    agent = Agent(server.address, "local", backend, state / "work", poll_interval_s=0.1,
                  commands=CommandPolicy.permissive(), inherit_env=True,
                  warm_start=args.warm_start)
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            agent.run()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=serve, name="local-agent", daemon=True)
    thread.start()
    devices = ", ".join(f"{d.arch}:{d.index}" for d in backend.devices())
    study_id = ""
    try:
        # The local agent first: a study submitted before it registers would have its
        # first commands sent to a node the server restored from the last run.
        deadline = time.monotonic() + AGENT_WAIT_S
        while not (session := server.service.sessions().get("local")) or \
                not session.connected:
            if failure or not thread.is_alive():
                raise HyperSackError(f"the local agent stopped: "
                                     f"{failure[0] if failure else 'at start'}")
            if time.monotonic() > deadline:
                raise HyperSackError(f"the local agent did not register in {AGENT_WAIT_S:g} s")
            time.sleep(0.05)
        with Client(server.address) as client:
            for old in client.studies():
                if old.state == "ACTIVE":
                    client.cancel(old.id)
                    console.print(f"cancelled {old.id}, left unfinished by an earlier run")
            study = client.submit(read_space_file(path), str(path))
            study_id = study.id
            console.print(f"{study.id}: {space.size()} trials on {backend.name} devices "
                          f"[{devices}], policy {args.policy or space.settings.policy}")
            last = watch(client, study.id, console)
            if failure:
                raise HyperSackError(f"the local agent stopped: {failure[0]}")
            print_results(client, study.id, "table", args.top, console)
            jobs = server.service.stats["profile_jobs"]
            failed_jobs = server.service.stats["profiles_failed"]
            why = ("the history knew every workload" if not jobs else
                   f"{jobs - failed_jobs} new workload(s) measured"
                   + (f", [red]{failed_jobs} failed[/]" if failed_jobs else ""))
            console.print(f"profile jobs: {jobs} ({why}; `hypersack profiles --db "
                          f"{state / 'run.db'}` lists the history)")
            if last.state != "COMPLETED" or last.counts.get("FAILED", 0):
                console.print(f"trial logs are under {state / 'work'}")
            return exit_code(last)
    except KeyboardInterrupt:
        console.print(f"interrupted; {study_id or 'the study'} is cancelled")
        if study_id:
            try:
                with Client(server.address) as client:
                    client.cancel(study_id)
            except HyperSackError:
                pass
        return 130
    finally:
        # The local agent leaving is the plan here, not a fault worth a warning.
        logging.getLogger("hypersack.server.service").setLevel(logging.ERROR)
        agent.stop()
        thread.join(timeout=15)
        server.stop()

