"""Random messages at the servicers: the server answers with clear status codes, keeps
serving, and its state stays consistent."""

from __future__ import annotations

import logging
import string
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc
from hypersack.server.app import HyperSackServer
from hypersack.testing.server import SLEEP_SPACE, RawAgent
from hypersack.testing.server import consistent as _consistent

text = st.text(alphabet=string.printable, max_size=30)
ids = st.one_of(text, st.sampled_from(["tiny-1-t00000", "tiny-1-t00001", "tiny-1-t00003",
                                       "tiny-1", ""]))
numbers = st.floats(allow_nan=True, allow_infinity=True)
metrics = st.dictionaries(text, numbers, max_size=4)
key = st.builds(pb.WorkloadKey, model=st.sampled_from(["resnet18", "x", ""]),
                batch_size=st.integers(-5, 300), optimizer=text, precision=text,
                fusion_width=st.integers(-1, 3))
agent_messages = st.one_of(
    st.builds(lambda r: pb.AgentMessage(heartbeat=pb.Heartbeat(running=r)),
              st.lists(st.builds(pb.RunningTrial, trial_id=ids,
                                 gpu_index=st.integers(-2, 3),
                                 peak_memory_mib=st.integers(-10, 10**7),
                                 peak_utilization_pct=numbers), max_size=3)),
    st.builds(lambda t: pb.AgentMessage(started=pb.TrialStarted(trial_id=t)), ids),
    st.builds(lambda t, s, m: pb.AgentMessage(metrics=pb.TrialMetrics(trial_id=t, step=s,
                                                                      metrics=m)),
              ids, st.integers(-2**40, 2**40), metrics),
    st.builds(lambda t, c, log, m, oom, peak: pb.AgentMessage(exited=pb.TrialExited(
        trial_id=t, exit_code=c, log_tail=log, metrics=m, out_of_memory=oom,
        peak_memory_mib=peak)), ids, st.integers(-300, 300), text, metrics, st.booleans(),
        st.integers(-10, 10**7)),
    st.builds(lambda k, a, ok, c, m, it, ipe, k2: pb.AgentMessage(profile=pb.ProfileResult(
        key=k, arch=a, ok=ok, error="x", profile=pb.ProfileRecord(
            key=k2, arch=a, compute_pct=c, memory_mib=m, iter_time_s=it, iters_per_epoch=ipe,
            setup_s=it, eval_s_per_epoch=c))),
        key, st.sampled_from(["A100", "H100", ""]), st.booleans(), numbers,
        st.integers(-10, 10**6), numbers, st.integers(-3, 10), key),
    st.builds(lambda n: pb.AgentMessage(register=pb.Register(node=n)), text),
    st.just(pb.AgentMessage()),
)


def test_random_agent_and_client_messages_leave_the_server_consistent(
        server: HyperSackServer, caplog: pytest.LogCaptureFixture) -> None:
    counter = iter(range(10**6))
    channel = grpc.insecure_channel(server.address)
    stub = pb_grpc.SchedulerStub(channel)
    stub.SubmitStudy(pb.SubmitStudyRequest(space_yaml=SLEEP_SPACE, source="t"))
    allowed = {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
               grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION}

    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(agent_messages, max_size=12), st.lists(ids, max_size=4),
           st.integers(0, 3))
    def check(messages: list[pb.AgentMessage], study_ids: list[str], gpus: int) -> None:
        agent = RawAgent(server.address)
        agent.register(f"fuzz{next(counter)}", gpus=gpus)
        for m in messages:
            agent.send(m)
        for sid in study_ids:
            for call, req in ((stub.GetStudy, pb.GetStudyRequest(study_id=sid)),
                              (stub.ListTrials, pb.ListTrialsRequest(study_id=sid)),
                              (stub.GetTrial, pb.GetTrialRequest(trial_id=sid)),
                              (stub.DrainNode, pb.DrainNodeRequest(node=sid))):
                try:
                    call(req, timeout=5)
                except grpc.RpcError as exc:
                    assert exc.code() in allowed, (exc.code(), exc.details())
        time.sleep(0.05)
        agent.close()
        _consistent(server)

    check()
    assert stub.GetStudy(pb.GetStudyRequest(study_id="tiny-1")).id == "tiny-1"
    channel.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


MANUAL_SPACE = """
name: mine
models: [resnet18]
hyperparameters:
  batch_size: [64, 128]
  lr: {distribution: loguniform, low: 1.0e-4, high: 1.0}
  layers: {distribution: int, low: 1, high: 4}
search: {type: manual, trials: 30}
settings: {epochs: 1}
program: {builtin: sleep}
"""

json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                                     st.floats(allow_nan=True, allow_infinity=True), text),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(text, inner, max_size=3), max_leaves=6)
param_maps = st.one_of(
    st.fixed_dictionaries({"batch_size": st.sampled_from([64, 128, 96, "64", 64.0]),
                           "lr": st.one_of(numbers, st.just(0.01)),
                           "layers": st.one_of(st.integers(-3, 6), numbers)}),
    st.dictionaries(text, json_values, max_size=4), json_values)


def test_random_asked_parameters_are_refused_clearly_or_run(
        server: HyperSackServer, caplog: pytest.LogCaptureFixture) -> None:
    import json

    channel = grpc.insecure_channel(server.address)
    stub = pb_grpc.SchedulerStub(channel)
    sid = stub.SubmitStudy(pb.SubmitStudyRequest(space_yaml=MANUAL_SPACE, source="t")).id
    added = 0

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(param_maps, min_size=1, max_size=3), st.booleans())
    def check(batch: list[object], raw: bool) -> None:
        nonlocal added
        texts = [json.dumps(p) if not raw else str(p)[:200] for p in batch]
        try:
            got = stub.AskTrials(pb.AskTrialsRequest(study_id=sid, params_json=texts),
                                 timeout=5).trials
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (exc.code(), exc.details())
            return
        added += len(got)
        for t in got:
            params = json.loads(t.params_json)
            assert params["batch_size"] in (64, 128) and 1e-4 <= params["lr"] <= 1.0
            assert params["layers"] in (1, 2, 3, 4)

    check()
    trials = stub.ListTrials(pb.ListTrialsRequest(study_id=sid)).trials
    assert len(trials) == added <= 30
    assert [t.id for t in trials] == [f"{sid}-t{i:05d}" for i in range(added)]
    channel.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


@given(st.lists(st.tuples(st.integers(-2**62, 2**62), numbers), max_size=6))
def test_a_heartbeats_peaks_are_cleaned_alike_on_the_fast_path_and_off_it(
        peaks: list[tuple[int, float]]) -> None:
    """clean_running takes values in bounds as they are and cleans the others: either
    way what clean_memory and clean_percent give (NaN, infinities, huge and negative
    numbers included)."""
    from hypersack.orchestrator import RunningTrial
    from hypersack.wire.convert import clean_memory, clean_percent, clean_running

    entries = [pb.RunningTrial(trial_id=f"t{i}", gpu_index=i, peak_memory_mib=m,
                               peak_utilization_pct=u, attempt=1)
               for i, (m, u) in enumerate(peaks)]
    got = clean_running(entries, RunningTrial)
    assert len(got) == len(entries)
    for r, e in zip(got, entries, strict=True):
        assert r.peak_memory_mib == clean_memory(e.peak_memory_mib)
        assert r.peak_utilization_pct == clean_percent(e.peak_utilization_pct)
        assert (r.trial_id, r.gpu_index, r.attempt) == (e.trial_id, e.gpu_index, 1)
