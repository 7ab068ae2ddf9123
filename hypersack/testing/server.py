"""Tests of the control plane: a server in-process on 127.0.0.1:0 with a manual-free
configuration, a raw agent stream that sends exactly the messages a test wants, and the
check that the server's state is consistent."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc
from hypersack.cli.client import Client
from hypersack.core.types import TrialState
from hypersack.policies.base import Need, compute_capacity
from hypersack.sampler.profiles import load_profiles
from hypersack.server.app import HyperSackServer
from hypersack.server.auth import LOCAL, Authenticator
from hypersack.server.intake import AgentSession
from hypersack.store.sqlite import SqliteStore
from hypersack.wire import tls
from hypersack.wire.settings import ServerSettings

# The example profiles of a checkout (a wheel has none: pass `profiles`).
EXAMPLE_PROFILES = Path(__file__).resolve().parents[2] / "examples" / "profiles-estimates.yaml"


SLEEP_SPACE = """
name: tiny
models: [resnet18]
hyperparameters: {batch_size: [64, 128], lr: [0.001, 0.01]}
settings: {epochs: 1, retries: 1, objective: {metric: loss, mode: min}}
program: {builtin: sleep}
"""


def make_server(tmp_path: Path, profiles: list[Path] | None = None) -> HyperSackServer:
    """A started server on 127.0.0.1:0 with a database under `tmp_path`, fast ticks and
    heartbeats, and the given profiles (default: the checkout's example estimates)."""
    if profiles is None:
        profiles = [EXAMPLE_PROFILES] if EXAMPLE_PROFILES.exists() else []
    settings = ServerSettings(listen="127.0.0.1:0", db=tmp_path / "s.db",
                              heartbeat_interval_s=0.2, heartbeat_timeout_s=30,
                              tick_interval_s=0.1, profiles=profiles)
    server = HyperSackServer(settings)
    server.start()
    return server


class RawAgent:
    """One AgentLink stream; `send` puts a message up, `next` reads one down."""

    def __init__(self, address: str, credentials: grpc.ChannelCredentials | None = None
                 ) -> None:
        self.channel = (grpc.insecure_channel(address) if credentials is None else
                        grpc.secure_channel(address, credentials))
        self.up: queue.Queue[pb.AgentMessage | None] = queue.Queue()
        self.down: queue.Queue[pb.ServerMessage | grpc.RpcError | None] = queue.Queue()
        stub = pb_grpc.AgentLinkStub(self.channel)  # type: ignore[no-untyped-call]
        self.call = stub.Connect(iter(self.up.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for msg in self.call:
                self.down.put(msg)
            self.down.put(None)
        except grpc.RpcError as exc:
            self.down.put(exc)

    def register(self, node: str, gpus: int = 1, running: tuple[str, ...] = ()) -> None:
        self.send(pb.AgentMessage(register=pb.Register(
            node=node, cores=48, backend="fake",
            gpus=[pb.GpuInfo(index=i, arch="A100", memory_mib=81920, uuid=f"U{i}")
                  for i in range(gpus)],
            running=[pb.RunningTrial(trial_id=t, gpu_index=0) for t in running])))

    def send(self, msg: pb.AgentMessage) -> None:
        self.up.put(msg)

    def next(self, timeout_s: float = 10) -> pb.ServerMessage | grpc.RpcError | None:
        return self.down.get(timeout=timeout_s)

    def launches(self, n: int) -> list[pb.LaunchTrial]:
        out: list[pb.LaunchTrial] = []
        while len(out) < n:
            msg = self.next()
            assert isinstance(msg, pb.ServerMessage), msg
            if msg.WhichOneof("body") == "launch":
                out.append(msg.launch)
        return out

    def close(self) -> None:
        self.up.put(None)
        self.channel.close()


def profiled_store(path: Path) -> SqliteStore:
    """A SQLite store at `path` holding the checkout's example profile estimates."""
    store = SqliteStore(path)
    if EXAMPLE_PROFILES.exists():
        for p in load_profiles(EXAMPLE_PROFILES):
            store.put_profile(p)
    return store


# What an agent of one A100-80GB registers with.
ONE_A100 = pb.Register(node="n0", cores=8, backend="fake", gpus=[
    pb.GpuInfo(index=0, arch="A100", memory_mib=81920, uuid="g0")])


def one_a100(**flags: bool) -> pb.Register:
    """ONE_A100 with what the agent says it reads (folded_acks, held_acks, batched)."""
    register = pb.Register()
    register.CopyFrom(ONE_A100)
    for name, value in flags.items():
        setattr(register, name, value)
    return register


def first_launch(session: AgentSession) -> pb.LaunchTrial:
    """The first launch queued to an agent's session (the service in-process)."""
    return next(m.launch for m in session.drain() if m is not None and m.HasField("launch"))


def wait(check: Callable[[], object], timeout_s: float = 10) -> None:
    """Until `check()` is true; AssertionError after the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def consistent(srv: HyperSackServer) -> None:
    """Every running trial sits on a registered node's GPU, and no GPU is over capacity."""
    orch = srv.service.orch
    with srv.service.locked():
        nodes = {n.spec.name: n for n in orch.nodes()}
        used: dict[tuple[str, int], int] = {}
        for t in orch.trials():
            if t.state == TrialState.RUNNING:
                assert t.node in nodes and t.demand is not None and t.gpu_index is not None
                gpu = (t.node, t.gpu_index)
                used[gpu] = used.get(gpu, 0) + Need.of(t.demand).compute
        for (node, idx), (_count, share) in orch.gpu_load().items():
            assert share <= 1.0 + 1e-9
            assert used.get((node, idx), 0) <= compute_capacity(3.0)


# A secured server: TLS, a CA, node certificates on demand, users with tokens.
@dataclass
class Secured:
    server: HyperSackServer
    certs: Path
    tokens: dict[str, str]  # user -> token

    def creds(self, kind: str | None = None, name: str = "") -> grpc.ChannelCredentials:
        if kind is None:
            return tls.channel_credentials(self.certs / "ca.crt")
        paths = tls.leaf_paths(self.certs, kind, name)
        if not paths.cert.exists():
            tls.issue(self.certs, kind, name)
        return tls.channel_credentials(paths.ca, paths.cert, paths.key)

    def client(self, user: str | None = None, *, token: str | None = None) -> Client:
        return Client(self.server.address, timeout_s=10, credentials=self.creds(),
                      token=token if token is not None else self.tokens.get(user or ""))

    def agent(self, kind: str | None = None, name: str = "") -> RawAgent:
        return RawAgent(self.server.agent_address, self.creds(kind, name))


def make_certs(root: Path) -> Path:
    certs = root / "certs"
    tls.init_ca(certs)
    tls.issue(certs, tls.SERVER, "localhost", alt_names=["localhost", "127.0.0.1"])
    return certs


def add_users(db: Path, **roles: str) -> dict[str, str]:
    store = SqliteStore(db)
    try:
        auth = Authenticator(store, enabled=True)
        tokens = {}
        for name, role in roles.items():
            auth.add_user(LOCAL, name, role)
            tokens[name] = auth.create_token(LOCAL, name)[1]
        return tokens
    finally:
        store.close()


def start(tmp_path: Path, **extra: object) -> Secured:
    certs = make_certs(tmp_path)
    db = tmp_path / "s.db"
    tokens = add_users(db, root="admin", alice="user", bob="user")
    settings = ServerSettings(listen="127.0.0.1:0", agent_listen="127.0.0.1:0", db=db,
                              tls_dir=certs, heartbeat_interval_s=0.2, tick_interval_s=0.1,
                              profiles=[EXAMPLE_PROFILES] if EXAMPLE_PROFILES.exists() else [],
                              **extra)  # type: ignore[arg-type]
    server = HyperSackServer(settings)
    server.start()
    return Secured(server, certs, tokens)
