"""Hardening: no input, failure or load stops the scheduler or leaves memory and store apart.

Each test drives a class of failure through the real entry point (files through the CLI,
messages through real gRPC, events through the orchestrator with a real store)."""

from __future__ import annotations

import math
import os
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc
from hypersack.cli.client import Client
from hypersack.cli.main import main
from hypersack.cli.text import safe, safe_log
from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import InvalidInput
from hypersack.core.types import Demand, NodeRecord, Profile, TrialState, WorkloadKey
from hypersack.orchestrator import (
    Heartbeat,
    NodeJoined,
    ProfilesImported,
    RunningTrial,
    StudySubmitted,
    Tick,
    TrialFinished,
)
from hypersack.server.app import HyperSackServer
from hypersack.store import MemoryStore, SqliteStore
from hypersack.testing.core import launches, make, prof, space
from hypersack.testing.server import SLEEP_SPACE, RawAgent, make_server
from hypersack.wire.settings import ServerSettings


# ----------------------------------------------------------------- numbers at boundaries
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400", "-1", "1e12"])
def test_profiles_file_with_a_bad_number_is_refused(tmp_path: Path, value: str,
                                                    capsys: Any) -> None:
    f = tmp_path / "p.csv"
    f.write_text("model,batch_size,arch,compute_pct,memory_mib,cores,iter_time_s,"
                 f"iters_per_epoch\nresnet18,64,A100,{value},1000,1,0.1,100\n")
    SqliteStore(tmp_path / "x.db").close()
    assert main(["profiles", "import", str(f), "--db", str(tmp_path / "x.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compute_pct" in err[0], err


def test_import_rpc_refuses_non_finite_demand_and_the_server_keeps_scheduling(
        server: HyperSackServer) -> None:
    bad = pb.ProfileRecord(key=pb.WorkloadKey(model="resnet18", batch_size=64), arch="A100",
                           compute_pct=math.inf, memory_mib=1000, cores=1, iter_time_s=0.1,
                           iters_per_epoch=10)
    channel = grpc.insecure_channel(server.address)
    stub = pb_grpc.SchedulerStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.ImportProfiles(pb.ImportProfilesRequest(profiles=[bad]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # An agent registering infinite cores is refused the same way.
    agent = RawAgent(server.address)
    agent.send(pb.AgentMessage(register=pb.Register(
        node="inf", cores=math.inf, gpus=[pb.GpuInfo(index=0, arch="A100", memory_mib=1)])))
    reply = agent.next()
    assert isinstance(reply, grpc.RpcError)
    assert reply.code() == grpc.StatusCode.INVALID_ARGUMENT and "cores" in reply.details()
    # ... and so is one with more GPUs than any node has.
    many = RawAgent(server.address)
    many.send(pb.AgentMessage(register=pb.Register(
        node="many", cores=8, gpus=[pb.GpuInfo(index=i, arch="A100", memory_mib=1)
                                    for i in range(100_000)])))
    reply = many.next()
    assert isinstance(reply, grpc.RpcError) and "at most 256" in reply.details()
    # The server still schedules: a real agent gets launches.
    good = RawAgent(server.address)
    good.register("n1", gpus=1)
    with Client(server.address) as c:
        c.submit(SLEEP_SPACE, "tiny.yaml")
    assert good.launches(1)
    for a in (agent, many, good):
        a.close()
    channel.close()


def test_heartbeat_with_huge_and_non_finite_observations_is_clamped(
        server: HyperSackServer) -> None:
    agent = RawAgent(server.address)
    agent.register("n1", gpus=1)
    with Client(server.address) as c:
        c.submit(SLEEP_SPACE, "tiny.yaml")
    (launch,) = agent.launches(1)
    agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat(
        running=[pb.RunningTrial(trial_id=launch.trial_id, gpu_index=0,
                                 peak_memory_mib=2**62, peak_utilization_pct=math.nan)],
        gpus=[pb.GpuState(index=0, utilization_pct=math.inf, memory_used_mib=-5),
              pb.GpuState(index=99999, utilization_pct=1.0)])))
    agent.send(pb.AgentMessage(exited=pb.TrialExited(
        trial_id=launch.trial_id, exit_code=0, metrics={"loss": math.inf, "acc": 0.5})))
    deadline = time.monotonic() + 10
    with Client(server.address) as c:
        while c.trial(launch.trial_id).state != "DIVERGED":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        t = c.trial(launch.trial_id)
        assert dict(t.metrics) == {"acc": 0.5}  # the infinite loss is not stored
        assert "loss is NaN or infinite" in t.reason and not t.has_objective
        (node,) = c.nodes()
        assert [g.index for g in node.gpus] == [0]
        assert node.gpus[0].utilization_pct == 0.0 and node.gpus[0].memory_used_mib == 0
    # The store reloads: nothing non-finite or out of range was written.
    store = SqliteStore(server.settings.db)
    assert all(p.demand.memory_mib <= 1 << 30 for p in store.list_profiles())
    store.close()
    agent.close()


@pytest.mark.parametrize("text", [
    "settings: {epochs: .inf}", "settings: {epochs: .nan}", "settings: {epochs: 1.0e+300}",
    "hyperparameters: {batch_size: [64], epochs: [0]}",
    "hyperparameters: {batch_size: [64], epochs: [-1]}",
    "hyperparameters: {batch_size: [64], epochs: ['abc']}",
    "hyperparameters: {batch_size: [64], epochs: [.nan]}",
    "hyperparameters: {batch_size: [64], lr: {distribution: uniform, low: 0, high: 1, "
    "num: 1000000000}}",
    "hyperparameters: {batch_size: [64], lr: {distribution: uniform, low: 0, high: 1, "
    "step: 1.0e-300}}",
    "hyperparameters: {batch_size: {distribution: int, low: 1, high: 100000000000000}}",
    "hyperparameters: {batch_size: [64], lr: [.inf]}",
    "hyperparameters: {batch_size: [1099511627776]}",
])
def test_bad_numbers_in_a_search_space_fail_validate_and_plan_with_one_line(
        tmp_path: Path, text: str, capsys: Any) -> None:
    base = {"name": "name: bad", "models": "models: [resnet18]",
            "hyperparameters": "hyperparameters: {batch_size: [64]}"}
    key = text.split(":", 1)[0]
    base[key] = text
    f = tmp_path / "s.yaml"
    f.write_text("\n".join(base.values()) + "\n")
    started = time.monotonic()
    assert main(["validate", str(f)]) == 2
    assert main(["plan", str(f), "--cluster", "1x1xA100-80GB",
                 "--profiles", "examples/profiles-estimates.yaml"]) == 2
    assert time.monotonic() - started < 20  # sized, never expanded
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err), err


@pytest.mark.parametrize("cluster", ["", "2x4xA100-0GB", "99999999999x4xA100-80GB",
                                     "1x100000xA100-80GB", "1x4xA100-80GB@0", "[/]",
                                     "1x4xA100-99999999999999GB"])
def test_bad_cluster_shorthand_is_one_line(cluster: str, capsys: Any) -> None:
    assert main(["plan", "examples/sp1.yaml", "--cluster", cluster,
                 "--profiles", "examples/profiles-estimates.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err


def test_hostile_files_are_one_line(tmp_path: Path, capsys: Any) -> None:
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\x00\xff\xfe" * 100)
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text("a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},"
        f"*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)},*{chr(97 + i)}]\n"
        for i in range(8)))
    for bad in (binary, tmp_path, deep, laughs, tmp_path / "missing.yaml"):
        for argv in (["validate", str(bad)],
                     ["plan", "examples/sp1.yaml", "--cluster", str(bad) + ".yaml"
                      if bad == tmp_path else str(bad), "--profiles",
                      "examples/profiles-estimates.yaml"],
                     ["plan", "examples/sp1.yaml", "--cluster", "1x1xA100-80GB",
                      "--profiles", str(bad)]):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith("error: "), (argv, err)


# ----------------------------------------------------------------- transactional core
class FailingStore(MemoryStore):
    """A store whose writes of one kind fail while `failing` names it."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: str | None = None

    def put_node(self, node: NodeRecord) -> None:
        if self.failing == "put_node":
            raise OSError("disk full")
        super().put_node(node)

    def put_profile(self, profile: Profile) -> None:
        if self.failing == "put_profile":
            raise OSError("disk full")
        super().put_profile(profile)


def _same(orch: Any, store: MemoryStore) -> None:
    """Memory equals the store: every trial, study, node and profile."""
    assert orch.trials() == store.list_trials()
    assert orch.studies() == store.list_studies()
    assert sorted(n.spec.name for n in orch.nodes()) == [n.spec.name for n in store.list_nodes()]
    assert sorted(orch.profiles(), key=lambda p: (p.key.label(), p.arch)) == \
        store.list_profiles()


def test_an_event_that_raises_changes_nothing_and_the_next_ones_go_on() -> None:
    store = FailingStore()
    orch, _, clock = make(store=store)
    orch.handle(NodeJoined(parse_shorthand("1x2xA100-80GB").nodes[0]))
    first = launches(orch.handle(StudySubmitted(space(n_lr=4))))
    assert len(first) == 4
    before = (orch.trials(), orch.gpu_load())
    store.failing = "put_node"
    other = parse_shorthand("1x1xA100-80GB").nodes[0].model_copy(update={"name": "late"})
    finished = TrialFinished(first[0].trial_id, "node0", {"loss": 1.0})
    result = orch.handle_batch([NodeJoined(other), finished])
    # The join raised half-way (the node was added in memory): it is refused and undone;
    # the exit after it in the same batch is applied.
    assert [type(e).__name__ for e, _ in result.refused] == ["NodeJoined"]
    assert not orch.has_node("late")
    assert orch.trial(first[0].trial_id).state == TrialState.COMPLETED
    assert orch.trials() != before[0]
    store.failing = None
    _same(orch, store)
    # A profile import that fails in the store leaves the history as it was.
    store.failing = "put_profile"
    with pytest.raises(OSError):
        orch.handle(ProfilesImported((prof("resnet18", 128),)))
    assert len(orch.profiles()) == 1
    store.failing = None
    _same(orch, store)
    clock.advance(1)
    orch.handle(Tick())
    _same(orch, store)


def test_a_decision_that_raises_is_undone_and_other_studies_are_placed() -> None:
    bad = Profile.model_construct(  # a value no boundary lets in, as a bug would
        key=WorkloadKey(model="resnet34", batch_size=64), arch="A100",
        demand=Demand.model_construct(compute_pct=math.inf, memory_mib=10, cores=1.0),
        iter_time_s=0.1, iters_per_epoch=10, setup_s=0.0, eval_s_per_epoch=0.0)
    orch, store, _ = make(profiles=[prof("resnet18", 64), bad])
    assert isinstance(store, MemoryStore)
    orch.handle(NodeJoined(parse_shorthand("1x2xA100-80GB").nodes[0]))
    assert launches(orch.handle(StudySubmitted(space(n_lr=2, models=("resnet34",))))) == []
    placed = launches(orch.handle(StudySubmitted(space(n_lr=2))))
    assert len(placed) == 2  # the second study is placed although the first one fails
    assert all(t.state == TrialState.PENDING for t in orch.trials("t-1"))
    _same(orch, store)


def test_rollback_restores_allocations_on_a_real_sqlite_store(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "x.db")
    orch, _, _ = make(store=store)
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    (a,) = launches(orch.handle(StudySubmitted(space(n_lr=1))))
    load = orch.gpu_load()
    # A heartbeat for the node, then an event that fails (a trial unknown to a cancel).
    result = orch.handle_batch([Heartbeat("node0", (RunningTrial(a.trial_id, 0, 5, 1.0),)),
                                TrialFinished("ghost", "node0")])
    assert len(result.stale) == 1 and orch.gpu_load() == load
    assert orch.trials() == store.list_trials()
    store.close()


# ----------------------------------------------------------------- server resources
def test_cancelled_watches_with_huge_intervals_free_their_threads(
        server: HyperSackServer) -> None:
    with Client(server.address) as c:
        c.submit(SLEEP_SPACE, "tiny.yaml")
    channel = grpc.insecure_channel(server.address)
    stub = pb_grpc.SchedulerStub(channel)
    deadline = time.monotonic() + 60
    opened = 0
    while opened < 100:  # far more than the pool would hold if each kept its thread
        call = stub.WatchStudy(pb.WatchStudyRequest(study_id="tiny-1", min_interval_s=1e9))
        try:
            next(call)
        except grpc.RpcError as exc:  # the bound: wait for a cancelled one to go
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() < deadline
            time.sleep(0.01)
            continue
        call.cancel()
        opened += 1
    while server.service.watches.watching() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.service.watches.watching() == 0
    # Concurrent watches are bounded per client: past the bound, RESOURCE_EXHAUSTED.
    open_calls = []
    for _ in range(server.service.watches.max_watches_per_client):
        call = stub.WatchStudy(pb.WatchStudyRequest(study_id="tiny-1", min_interval_s=1e300))
        next(call)
        open_calls.append(call)
    with pytest.raises(grpc.RpcError) as err:
        next(stub.WatchStudy(pb.WatchStudyRequest(study_id="tiny-1")))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for call in open_calls:
        call.cancel()
    with Client(server.address) as c:
        assert c.study("tiny-1").id == "tiny-1"  # still serving
    channel.close()


def test_a_second_server_on_the_same_database_is_refused(tmp_path: Path) -> None:
    first = make_server(tmp_path)
    try:
        with pytest.raises(InvalidInput, match=r"in use by hypersack-server pid \d+"):
            make_server(tmp_path)
        assert stat.S_IMODE(os.stat(tmp_path / "s.db").st_mode) == 0o600
    finally:
        first.stop(0)
    make_server(tmp_path).stop(0)  # free again once the first one stopped


@pytest.mark.parametrize("content", ["garbage", "truncated", "schema", "bad-row"])
def test_a_bad_database_is_refused_with_one_line(tmp_path: Path, content: str,
                                                 capsys: Any) -> None:
    db = tmp_path / "bad.db"
    if content == "garbage":
        db.write_bytes(os.urandom(8192))
    elif content == "truncated":
        good = tmp_path / "good.db"
        SqliteStore(good).close()
        db.write_bytes(good.read_bytes()[:1000])
    elif content == "schema":
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE studies (x INTEGER)")
        con.commit()
        con.close()
    else:
        store = SqliteStore(db)
        store.put_profile(prof("resnet18", 64))
        store.close()
        con = sqlite3.connect(db)
        con.execute("UPDATE profiles SET doc = replace(doc, '\"compute_pct\":50.0', "
                    "'\"compute_pct\":null')")
        con.commit()
        con.close()
    from hypersack.server.app import main as server_main

    assert server_main(["--listen", "127.0.0.1:0", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hypersack-server: error: database"), err


class _Boom(BaseException):
    pass


class _BreakingClock(ManualClock):
    def __init__(self) -> None:
        super().__init__(1000.0)
        self.broken = False

    def now(self) -> float:
        if self.broken and threading.current_thread().name == "hypersack-ticker":
            raise _Boom("the clock broke")
        return super().now()


def test_a_loop_that_stops_turns_health_not_serving(tmp_path: Path) -> None:
    clock = _BreakingClock()
    settings = ServerSettings(listen="127.0.0.1:0", db=tmp_path / "s.db", tick_interval_s=0.05)
    srv = HyperSackServer(settings, clock=clock)
    srv.start()
    try:
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(srv.address))
        ok = health.Check(health_pb2.HealthCheckRequest(service=""))
        assert ok.status == health_pb2.HealthCheckResponse.SERVING
        clock.broken = True
        assert srv.failed.wait(10)
        assert "hypersack-ticker stopped" in (srv.service.fatal or "")
        reply = health.Check(health_pb2.HealthCheckRequest(service=""))
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        srv.stop(0)


# ----------------------------------------------------------------- output
def test_user_strings_are_not_markup_and_logs_lose_escape_sequences() -> None:
    assert safe("[/]") == "\\[/]"
    assert safe("a\x1b[31mred\x07\nb") == "ared b"
    assert safe_log("ok\x1b[2J\x1b]0;title\x07done\r\nnext\x9b") == "okdone\nnext"


def test_status_results_and_logs_print_hostile_strings(server: HyperSackServer,
                                                       capsys: Any, tmp_path: Path) -> None:
    agent = RawAgent(server.address)
    agent.register("n1", gpus=1)
    f = tmp_path / "s.yaml"
    f.write_text(SLEEP_SPACE.replace("lr: [0.001, 0.01]", "lr: [0.001, 0.01], tag: ['[/]']"))
    s = ["--server", server.address]
    assert main(["submit", str(f), *s]) == 0
    (launch,) = agent.launches(1)
    agent.send(pb.AgentMessage(exited=pb.TrialExited(
        trial_id=launch.trial_id, exit_code=3, log_tail="boom\x1b[2J\x1b]0;pwned\x07[/]")))
    time.sleep(0.5)
    for argv in (["status", "tiny-1"], ["results", "tiny-1"], ["nodes"],
                 ["logs", launch.trial_id]):
        assert main([*argv, *s]) == 0, argv
    out = capsys.readouterr().out
    assert "\x1b[2J" not in out and "\x1b]0;" not in out and "[/]" in out
    agent.close()

