"""A cluster of real processes on loopback for tests: a hypersack-server and fake-backend
agents, each its own process (so SIGKILL means what it says), with TLS by default, and the
small client calls the tests make of it."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.client import Client
from hypersack.server.auth import LOCAL, Authenticator
from hypersack.store.sqlite import SqliteStore
from hypersack.testing.server import EXAMPLE_PROFILES
from hypersack.wire import tls as _tls

# Heartbeats every 0.3 s. A node is lost after 20 s of silence (its agent's fence: 10 s),
# so a test whose agent starves for seconds on a loaded machine (CI shares its two cores)
# sees no spurious loss: a fused group fenced and regrouped, an attempt run twice.
# Tests of loss itself start the server with FAST_LOSS.
SERVER_FLAGS = ["--heartbeat-interval-s", "0.3", "--heartbeat-timeout-s", "20",
                "--profiles", str(EXAMPLE_PROFILES)]
# A node lost after 3 s of silence (fence 1.5 s): for tests of loss and fencing.
FAST_LOSS = ("--heartbeat-timeout-s", "3")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 60.0,
             every_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Cluster:
    """A server and agents as child processes, logs under tmp_path. With `tls` (the
    default), as a secured cluster runs: TLS, agents with node certificates on the
    mutual-TLS port, clients with an admin's token."""

    def __init__(self, tmp_path: Path, tls: bool = True) -> None:
        self.tmp = tmp_path
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.tls = tls
        self.agent_address = f"127.0.0.1:{free_port()}" if tls else self.address
        self.certs = tmp_path / "certs"
        self.db = tmp_path / "server.db"
        self.admin_token = ""
        if tls:
            _tls.init_ca(self.certs)
            _tls.issue(self.certs, _tls.SERVER, "localhost",
                       alt_names=["localhost", "127.0.0.1"])
            self.admin_token = self.add_user("admin", "admin")
        self.server: subprocess.Popen[bytes] | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for key in [k for k in self._env if k.startswith("HYPERSACK_")]:
            del self._env[key]

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None
               ) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "ab")
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                env={**self._env, **(env or {})}, cwd=self.tmp,
                                start_new_session=True)

    def add_user(self, name: str, role: str) -> str:
        """A user in the database (the server stopped, or not started yet) and a token."""
        store = SqliteStore(self.db)
        try:
            auth = Authenticator(store, enabled=True)
            auth.add_user(LOCAL, name, role)
            return auth.create_token(LOCAL, name)[1]
        finally:
            store.close()

    def tls_flags(self) -> list[str]:
        return ["--tls-dir", str(self.certs), "--agent-listen", self.agent_address] \
            if self.tls else []

    def tls_flags_for_agent(self, name: str) -> list[str]:
        """The agent's TLS flags; its node certificate is issued here the first time."""
        if not self.tls:
            return []
        if not _tls.leaf_paths(self.certs, _tls.NODE, name).cert.exists():
            _tls.issue(self.certs, _tls.NODE, name)
        return ["--tls-dir", str(self.certs), "--tls-server-name", "localhost"]

    def channel(self) -> grpc.Channel:
        if not self.tls:
            return grpc.insecure_channel(self.address)
        return grpc.secure_channel(self.address, self.credentials())

    def credentials(self, cert: Path | None = None, key: Path | None = None
                    ) -> grpc.ChannelCredentials:
        return _tls.channel_credentials(self.certs / "ca.crt", cert, key)

    def start_server(self, *extra: str) -> None:
        self.server = self._spawn("server", [
            sys.executable, "-m", "hypersack.server.app", "--listen", self.address,
            "--db", str(self.db), *self.tls_flags(), *SERVER_FLAGS, *extra])
        channel = self.channel()
        stub = health_pb2_grpc.HealthStub(channel)

        def serving() -> bool:
            assert self.server is not None and self.server.poll() is None, self.logs("server")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service="hypersack.v1.Scheduler"),
                                   timeout=1)
            except grpc.RpcError:
                return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

        wait_for("the server to serve", serving, 30)
        channel.close()

    def kill_server(self) -> None:
        assert self.server is not None
        os.killpg(self.server.pid, signal.SIGKILL)
        self.server.wait()

    def start_agent(self, name: str, inventory: str = "1xA100-80GB@48",
                    *extra: str, env: dict[str, str] | None = None) -> None:
        """An agent that runs command programs (`--allow-commands`) unless `extra` says
        otherwise (`--no-commands` here: leave the flag out)."""
        flags = [f for f in extra if f != "--no-commands"]
        if "--no-commands" not in extra and not any(f.startswith("--allow-commands")
                                                    for f in extra):
            flags.append("--allow-commands")
        flags += self.tls_flags_for_agent(name)
        if os.geteuid() == 0 and not any(f.startswith("--run-as") for f in flags):
            # CI runs as root, and the interpreter lives where other users cannot read it.
            flags.append("--allow-root-trials")
        if os.geteuid() != 0 and not any(f.startswith("--owner") for f in flags):
            flags += ["--owner", "*"]  # one test user's machine: any owner's trials
        self.agents[name] = self._spawn(name, [
            sys.executable, "-m", "hypersack.agent.app", "--server", self.agent_address,
            "--node", name, "--backend", "fake", "--inventory", inventory,
            "--workdir", str(self.tmp / "work"), *flags], env)

    def kill_agent(self, name: str) -> None:
        proc = self.agents.pop(name)
        os.kill(proc.pid, signal.SIGKILL)  # the agent only: its trials are orphaned
        proc.wait()

    def client(self, token: str | None = None) -> Client:
        return Client(self.address, timeout_s=10, token=token or self.admin_token or None,
                      credentials=self.credentials() if self.tls else None)

    def cli_flags(self) -> list[str]:
        """What `hypersack ...` needs to reach this server (the token goes in the env)."""
        return ["--server", self.address,
                *(["--tls-ca", str(self.certs / "ca.crt")] if self.tls else [])]

    def logs(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def stop(self) -> None:
        for proc in [*self.agents.values(), *([self.server] if self.server else [])]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in [*self.agents.values(), *([self.server] if self.server else [])]:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        # Trials orphaned by a SIGKILLed agent sleep on; end them.
        subprocess.run(["pkill", "-f", str(self.tmp / "work")], check=False)  # noqa: S607


def space_yaml(name: str, *, seconds_per_epoch: float = 1.0, epochs: float = 2,
               lrs: str = "[0.001, 0.01]", models: str = "[resnet18, mobilenet_v2]",
               batch_sizes: str = "[64, 128]", retries: int = 2,
               program: str | None = None, ratio: float = 3.0) -> str:
    # A command program is its own workload: these tests state its demand rather than
    # profile it (the built-in sleep uses the example profiles' estimates).
    demand = ", demand: {compute_pct: 40, memory_mib: 2000, cores: 2}" if program else ""
    program = program or ("{builtin: sleep, options: {seconds_per_epoch: "
                          f"{seconds_per_epoch}, iters_per_epoch: 4}}}}")
    return f"""
name: {name}
models: {models}
hyperparameters:
  batch_size: {batch_sizes}
  lr: {lrs}
settings: {{epochs: {epochs}, retries: {retries}, oversubscription: {{A100: {ratio}}}{demand}}}
program: {program}
"""


def submit(c: Cluster, text: str) -> str:
    with c.client() as client:
        return str(client.submit(text, "test.yaml").id)


def trials(c: Cluster, study: str) -> list[pb.Trial]:
    with c.client() as client:
        return client.trials(study)


def state(c: Cluster, study: str) -> str:
    with c.client() as client:
        return str(client.study(study).state)


def done(c: Cluster, study: str, timeout_s: float = 90) -> list[pb.Trial]:
    wait_for(f"{study} to complete", lambda: state(c, study) != "ACTIVE", timeout_s, 0.3)
    return trials(c, study)


# A command program that logs each of its attempts (trial id, attempt, time) to a shared
# file as it starts, every 0.1 s while it runs, when it is stopped and when it ends:
# `python ATTEMPT_LOGGER LOG SECONDS`. `attempt_runs` reads the log back.
ATTEMPT_LOGGER = """
import os, signal, sys, time
log, seconds = sys.argv[1], float(sys.argv[2])
me = f"{os.environ['HYPERSACK_TRIAL_ID']} {os.environ['HYPERSACK_ATTEMPT']}"
def say(what):
    with open(log, "a") as f:
        f.write(f"{what} {me} {time.time():.3f}\\n")
def stopped(*_):
    say("killed")
    sys.exit(143)
signal.signal(signal.SIGTERM, stopped)
say("start")
end = time.monotonic() + seconds
while time.monotonic() < end:
    say("alive")
    time.sleep(0.1)
say("end")
"""


def attempt_runs(log: Path) -> dict[tuple[str, str], tuple[float, float, bool]]:
    """(trial, attempt) -> (first seen, last seen, ran to its end), from ATTEMPT_LOGGER's
    log."""
    out: dict[tuple[str, str], tuple[float, float, bool]] = {}
    for line in log.read_text().splitlines():
        what, trial, attempt, at = line.split()
        first, last, ended = out.get((trial, attempt), (float(at), float(at), False))
        out[trial, attempt] = (min(first, float(at)), max(last, float(at)),
                               ended or what == "end")
    return out


def overlapping(runs: dict[tuple[str, str], tuple[float, float, bool]]) -> list[str]:
    """The trials two of whose attempts ran at the same time."""
    by_trial: dict[str, list[tuple[float, float, bool]]] = {}
    for (trial, _), run in runs.items():
        by_trial.setdefault(trial, []).append(run)
    return sorted(trial for trial, spans in by_trial.items()
                  if any(a[1] >= b[0] for a, b in itertools.pairwise(sorted(spans))))
