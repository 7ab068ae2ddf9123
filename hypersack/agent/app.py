"""`hypersack-agent`: one per GPU node; dials the server and runs what it is told."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from hypersack import __version__
from hypersack.agent.accounts import TrialUsers
from hypersack.agent.agent import Agent
from hypersack.agent.devices import BACKENDS, make_backend
from hypersack.agent.guard import CommandPolicy
from hypersack.agent.launcher import node_dir
from hypersack.agent.metrics import AgentCollector
from hypersack.agent.mps import MpsControl
from hypersack.agent.procs import become_subreaper
from hypersack.core.bounds import is_name
from hypersack.core.errors import HyperSackError, InvalidInput
from hypersack.wire.logs import add_log_flags, parse_daemon_args
from hypersack.wire.metrics import serve_metrics
from hypersack.wire.settings import AgentSettings, load_settings
from hypersack.wire.tls import NODE, certificate_identity, channel_credentials


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hypersack-agent",
        description="HyperSack node agent: registers this node's devices with the server, "
                    "launches trials and profile runs, reports heartbeats and exits. "
                    "Settings come from flags, then HYPERSACK_* environment variables, "
                    "then --config.")
    p.add_argument("--config", type=Path, help="YAML file of settings")
    p.add_argument("--server", help="server address (default 127.0.0.1:50051)")
    p.add_argument("--node", help="this node's name (default: the host name); unique per agent")
    p.add_argument("--backend", choices=BACKENDS,
                   help="devices: nvml (NVIDIA GPUs), cpu (the CPU as one device), fake "
                        "(a made-up inventory, trials run on the CPU), auto (nvml if a "
                        "driver is found, else cpu; the default)")
    p.add_argument("--inventory", help="for --backend fake: e.g. 4xA100-80GB@88")
    p.add_argument("--workdir", type=Path, help="where trial directories and logs go "
                   "(default ./hypersack-work)")
    p.add_argument("--checkpoint-dir", type=Path, help="keep trials' checkpoints here "
                   "(default: under --workdir, on this node): a folder every node mounts "
                   "lets a paused trial resume on any node")
    p.add_argument("--log-max-mib", type=int, help="cap on each trial's log in MiB; past half "
                   "of it the last quarter is kept in log.1.txt (default 64)")
    p.add_argument("--allow-commands", nargs="?", const="*", metavar="EXE,...",
                   help="run `command` programs of studies (default: built-in programs "
                   "only); optionally only these executables, e.g. python,/opt/bin/train "
                   "(without names any executable runs, and the guard catches only the "
                   "code runners it knows: name them where users do not trust each other)")
    p.add_argument("--allow-shell", action="store_true", default=None,
                   help="also run templates that start a shell or pass inline code "
                   "(sh -c, python -c): a hyperparameter value there runs as code")
    p.add_argument("--allow-modules", metavar="MODULE,...",
                   help="modules `python -m` may run in command templates (pkg.* for a "
                   "package's); none by default")
    p.add_argument("--pass-env", action="append", metavar="NAME",
                   help="an environment variable trials may see besides PATH, HOME, the "
                   "locale and CUDA's (repeatable; PREFIX* for many)")
    p.add_argument("--run-as", metavar="USER", help="run trials as this unprivileged Unix "
                   "user (an agent started as root needs this or --user-map)")
    p.add_argument("--user-map", action="append", metavar="OWNER=USER",
                   help="run the trials of a study owner as this Unix user (repeatable, or "
                   "comma-separated); others run as --run-as, or are refused")
    p.add_argument("--owner", metavar="NAME",
                   help="run only this study owner's trials (needed by an agent that is not "
                   "root on a secured cluster: its trials run as its own user and could "
                   "read each other's files; '*': any owner's, with no isolation)")
    p.add_argument("--allow-root-trials", action="store_true", default=None,
                   help="an agent started as root may run trials as root: a single-user "
                   "machine only (logged as a warning at every start)")
    p.add_argument("--no-warm-start", dest="warm_start", action="store_false", default=None,
                   help="start every trial in a new interpreter (default: Python trials "
                   "fork from a warm process that imported their libraries once)")
    p.add_argument("--no-mps", dest="mps", action="store_false", default=None,
                   help="no MPS daemons: co-located trials time-slice (default: one MPS "
                   "daemon per GPU where nvidia-cuda-mps-control is found)")
    p.add_argument("--tls-dir", type=Path, help="a `hypersack certs` directory: ca.crt and "
                   "nodes/NODE.crt, nodes/NODE.key (then --server is the agent port)")
    p.add_argument("--tls-ca", type=Path, help="the cluster CA certificate")
    p.add_argument("--tls-cert", type=Path, help="this node's certificate (`hypersack certs "
                   "issue --node NAME`); its name is the node name")
    p.add_argument("--tls-key", type=Path, help="this node's private key (mode 0600)")
    p.add_argument("--tls-server-name", help="the name in the server's certificate, when "
                   "--server dials another name or address")
    p.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics: this node's "
                   "GPUs, trials and MPS daemons (loopback, or --metrics-insecure; with "
                   "TLS, HTTPS asking for a client certificate of the cluster CA)")
    p.add_argument("--metrics-insecure", action="store_true", default=None,
                   help="serve plain-HTTP metrics on a non-loopback address without TLS")
    add_log_flags(p)
    p.add_argument("--version", action="version", version=f"hypersack-agent {__version__}")
    return p


def one_owner(owner: str | None, users: TrialUsers, *, secured: bool) -> str:
    """The one owner whose trials this agent runs ("": any owner's). An agent that does
    not switch users runs every trial as itself: its trials can read whatever it can
    (its node key, its environment, each other's files), so on a secured cluster it runs
    one owner's trials only, named with --owner ('*': any, said to be no isolation)."""
    if owner == "*":
        return ""
    if owner:
        if not is_name(owner):
            raise InvalidInput(f"--owner {owner[:80]!r}: a user name (letters, digits, "
                               "_.:@+=-) or '*'")
        return owner
    if secured and not users.switches and os.geteuid() != 0:
        raise InvalidInput(
            "this agent is not root, so every trial runs as its Unix user and can read "
            "what it can (the node's key, its environment, other trials' files): give "
            "--owner NAME to run one study owner's trials only (--owner '*' for any "
            "owner's, with no isolation), or start it as root with --user-map")
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_daemon_args(_parser(), argv)
    try:
        settings = load_settings(AgentSettings, {
            "server": args.server, "node": args.node, "backend": args.backend,
            "inventory": args.inventory, "workdir": args.workdir,
            "checkpoint_dir": args.checkpoint_dir,
            "log_max_mib": args.log_max_mib, "allow_commands": args.allow_commands,
            "allow_shell": args.allow_shell, "allow_modules": args.allow_modules,
            "pass_env": args.pass_env,
            "tls_dir": args.tls_dir, "tls_ca": args.tls_ca, "tls_cert": args.tls_cert,
            "tls_key": args.tls_key, "tls_server_name": args.tls_server_name,
            "run_as": args.run_as, "user_map": args.user_map, "owner": args.owner,
            "allow_root_trials": args.allow_root_trials, "mps": args.mps,
            "warm_start": args.warm_start,
            "metrics_listen": args.metrics_listen,
            "metrics_insecure": args.metrics_insecure}, args.config)
        users = TrialUsers.parse(settings.run_as, settings.user_map,
                                 allow_root=settings.allow_root_trials)
        cert_node = (certificate_identity(settings.tls_cert)
                     if settings.tls_cert is not None else None)
        node = settings.node or (cert_node.name if cert_node else socket.gethostname())
        if not is_name(node):
            raise InvalidInput(f"node name {node[:80]!r}: use letters, digits and _.:@+=- "
                               "(give --node)")
        tls = settings.tls(node)
        credentials = None
        if tls is not None:
            ident = certificate_identity(tls.cert)
            if ident.kind != NODE or ident.name != node:
                raise InvalidInput(f"{tls.cert} names {ident.kind} {ident.name!r}, not node "
                                   f"{node!r}: the server accepts an agent only with its "
                                   f"node's certificate (hypersack certs issue --node {node})")
            credentials = channel_credentials(tls.ca, tls.cert, tls.key)
        owner = one_owner(settings.owner, users, secured=tls is not None)
        backend = make_backend(settings.backend, inventory=settings.inventory, node=node)
        agent = Agent(settings.server, node, backend, settings.workdir,
                      poll_interval_s=settings.poll_interval_s,
                      reconnect_max_s=settings.reconnect_max_s,
                      log_max_bytes=settings.log_max_mib << 20,
                      commands=CommandPolicy.parse(settings.allow_commands, settings.allow_shell,
                                                  settings.allow_modules),
                      pass_env=settings.pass_env, credentials=credentials,
                      server_name=settings.tls_server_name, users=users,
                      # MPS for GPUs: not for the CPU backend, which has none.
                      mps=MpsControl(node_dir(settings.workdir, node), backend.devices(),
                                     enabled=settings.mps and backend.name != "cpu"),
                      checkpoints=settings.checkpoint_dir, owner=owner,
                      warm_start=settings.warm_start)
    except HyperSackError as exc:
        print(f"hypersack-agent: error: {exc}", file=sys.stderr)
        return 2

    if os.geteuid() == 0 and not users.switches:
        logging.getLogger("hypersack.agent").warning(
            "trials run as ROOT on this node (--allow-root-trials): any study's program "
            "owns the machine")
    elif users.switches:
        logging.getLogger("hypersack.agent").info("trials run %s", users.describe())
    if users.pooled:
        logging.getLogger("hypersack.agent").warning(
            "--run-as %s: the trials of every owner not in --user-map run as that one "
            "account, with NO ISOLATION between users (one can read and signal another's "
            "trials); map each owner to their own account (--user-map OWNER=USER, or *=*)",
            users.default.name if users.default else "")
    policy = agent.commands
    if policy.allow_commands and not policy.executables and not policy.allow_shell:
        logging.getLogger("hypersack.agent").warning(
            "--allow-commands without names: any executable runs; the guard refuses the "
            "shells, launchers and interpreters it knows, and a program it does not know "
            "that runs code named in its arguments is not caught: name the executables "
            "(--allow-commands python,/opt/bin/train) where users do not trust each other")
    if owner:
        logging.getLogger("hypersack.agent").info(
            "this agent runs the trials of %s only", owner)
    elif os.geteuid() != 0 and settings.owner == "*":
        logging.getLogger("hypersack.agent").warning(
            "--owner '*': every owner's trials run as this agent's Unix user, with NO "
            "ISOLATION between users or from the agent (its key, its environment)")

    def _stop(signum: int, frame: object) -> None:
        agent.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    # Descendants that escape a trial's process group become ours, not init's, so the
    # agent kills and reaps them when their trial ends.
    become_subreaper()
    metrics = None
    try:
        if settings.metrics_listen:
            metrics = serve_metrics(settings.metrics_listen, AgentCollector(agent), tls=tls,
                                    insecure=settings.metrics_insecure,
                                    insecure_flag="--metrics-insecure")
        agent.run()
    except HyperSackError as exc:
        print(f"hypersack-agent: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if metrics is not None:
            metrics.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
