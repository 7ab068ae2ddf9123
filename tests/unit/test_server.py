"""The server in-process on 127.0.0.1:0, driven through real gRPC by the client and by a
raw agent stream that sends exactly the messages a test wants."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.client import Client
from hypersack.core.errors import InvalidInput, NotFound
from hypersack.server.app import HyperSackServer
from hypersack.server.bridge import LoopThread, Waker
from hypersack.testing.server import SLEEP_SPACE, RawAgent
from hypersack.testing.server import wait as _wait


def test_submit_inspect_and_errors(server: HyperSackServer) -> None:
    with Client(server.address) as c:
        study = c.submit(SLEEP_SPACE, "tiny.yaml")
        assert study.id == "tiny-1" and study.counts["PROFILING"] + study.counts["PENDING"] == 4
        assert [s.id for s in c.studies()] == ["tiny-1"]
        trials = c.trials("tiny-1")
        assert len(trials) == 4 and json.loads(trials[0].params_json)["model"] == "resnet18"
        assert c.trial(trials[0].id).id == trials[0].id
        with pytest.raises(NotFound, match="no study 'nope'"):
            c.study("nope")
        with pytest.raises(NotFound):
            c.trials("nope")
        with pytest.raises(NotFound, match="no trial"):
            c.trial("nope-t00001")
        with pytest.raises(InvalidInput, match=r"bad.yaml: models.0: unknown model 'resnet99'"):
            c.submit(SLEEP_SPACE.replace("resnet18", "resnet99"), "bad.yaml")
        with pytest.raises(InvalidInput, match="not valid YAML"):
            c.submit("name: [", "broken.yaml")
        with pytest.raises(InvalidInput, match="larger than"):
            c.submit("# " + "x" * (2 << 20), "huge.yaml")
        train = "builtin: train, options: {%s}"
        with pytest.raises(InvalidInput, match=r"t.yaml: program.options: seconds_per_epoch"):
            c.submit(SLEEP_SPACE.replace("builtin: sleep", train % "seconds_per_epoch: 1"),
                     "t.yaml")  # the sleep program's options are not train's
        with pytest.raises(InvalidInput, match=r"resnet18 trains on cifar10 \(or synthetic\)"):
            c.submit(SLEEP_SPACE.replace("builtin: sleep", train % "dataset: imdb"), "t.yaml")
        with pytest.raises(NotFound, match="no node"):
            c.drain("ghost")
        assert c.cancel("tiny-1").state == "CANCELLED"
        assert c.study("tiny-1").counts["CANCELLED"] == 4
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(server.address))
        reply = health.Check(health_pb2.HealthCheckRequest(service="hypersack.v1.AgentLink"))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_agent_stream_launch_finish_and_stale_events(server: HyperSackServer) -> None:
    agent = RawAgent(server.address)
    agent.register("n1")
    first = agent.next()
    assert isinstance(first, pb.ServerMessage) and first.registered.heartbeat_interval_s == 0.2
    with Client(server.address) as c:
        c.submit(SLEEP_SPACE, "tiny.yaml")
        launches = agent.launches(4)
        assert {m.program.builtin for m in launches} == {"sleep"}
        assert all(m.compute_pct > 0 and m.memory_mib > 0 for m in launches)
        done = launches[0].trial_id
        agent.send(pb.AgentMessage(started=pb.TrialStarted(trial_id=done)))
        agent.send(pb.AgentMessage(metrics=pb.TrialMetrics(trial_id=done, step=1,
                                                           metrics={"loss": 0.5})))
        agent.send(pb.AgentMessage(exited=pb.TrialExited(
            trial_id=done, exit_code=0, log_tail="ok\n", metrics={"loss": 0.25, "acc": 0.9})))
        # Events for trials this agent does not hold change nothing and keep the stream.
        agent.send(pb.AgentMessage(exited=pb.TrialExited(trial_id="ghost", exit_code=0)))
        agent.send(pb.AgentMessage(exited=pb.TrialExited(trial_id=done, exit_code=1)))
        agent.send(pb.AgentMessage(register=pb.Register(node="again")))
        agent.send(pb.AgentMessage())
        failed = launches[1].trial_id
        agent.send(pb.AgentMessage(exited=pb.TrialExited(trial_id=failed, exit_code=3,
                                                         log_tail="boom")))

        def settled() -> bool:
            t = c.trial(failed)
            return c.trial(done).state == "COMPLETED" and t.launches == 2

        _wait(settled)
        t = c.trial(done)
        assert t.objective == 0.25 and t.metrics["acc"] == 0.9 and t.log_tail == "ok\n"
        relaunch = agent.launches(1)[0]
        assert relaunch.trial_id == failed
        assert c.trial(failed).failures == 1 and "retry 1 of 1" in c.trial(failed).reason
        (node,) = c.nodes()
        assert node.name == "n1" and node.connected and node.gpus[0].trials == 3
        (level,) = c.cluster().sharing  # the cluster's one architecture
        assert (level.arch, level.configured, level.ratio, level.learning) == \
            ("A100", 3.0, 3.0, True)
    agent.close()


def test_duplicate_node_name_is_refused_and_first_agent_keeps_going(
        server: HyperSackServer) -> None:
    a = RawAgent(server.address)
    a.register("n1")
    assert isinstance(a.next(), pb.ServerMessage)
    b = RawAgent(server.address)
    b.register("n1")
    err = b.next()
    assert isinstance(err, grpc.RpcError)
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS and "already connected" in err.details()
    c = RawAgent(server.address)
    c.send(pb.AgentMessage(heartbeat=pb.Heartbeat()))
    err = c.next()
    assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    d = RawAgent(server.address)
    d.send(pb.AgentMessage(register=pb.Register(node="", cores=-1)))
    err = d.next()
    assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    with Client(server.address) as client:
        client.submit(SLEEP_SPACE, "tiny.yaml")
        assert len(a.launches(4)) == 4
    for x in (a, b, c, d):
        x.close()


def test_reconnecting_agent_has_its_trials_adopted(server: HyperSackServer) -> None:
    a = RawAgent(server.address)
    a.register("n1")
    with Client(server.address) as c:
        c.submit(SLEEP_SPACE, "tiny.yaml")
        ids = [m.trial_id for m in a.launches(4)]
        a.close()
        _wait(lambda: not c.nodes()[0].connected)
        b = RawAgent(server.address)
        b.register("n1", running=tuple(ids[:3]))  # one did not survive
        _wait(lambda: c.trial(ids[3]).launches == 2)
        assert [c.trial(i).launches for i in ids[:3]] == [1, 1, 1]
        b.close()


def test_one_wake_up_of_the_loop_for_many_streams() -> None:
    # A decision that queues launches for 50 agents wakes the event loop once (one write
    # to its self-pipe), not once per agent stream; every stream's callback still runs,
    # and callbacks asked for after that wake-up ran get one of their own.
    loop_thread = LoopThread("test-loop")
    try:
        loop = loop_thread.run(_running_loop())
        writes = 0
        original = loop.call_soon_threadsafe

        def counted(*args: object) -> object:
            nonlocal writes
            writes += 1
            return original(*args)  # type: ignore[arg-type]
        loop.call_soon_threadsafe = counted  # type: ignore[method-assign,assignment]
        waker = Waker(loop)
        ran: list[int] = []
        blocker = threading.Event()
        loop.call_soon_threadsafe(blocker.wait, 10)  # hold the loop while 50 are asked for
        for i in range(50):
            waker.call(functools.partial(ran.append, i))
        blocker.set()
        loop_thread.run(_running_loop())  # the loop ran what was due before this
        assert sorted(ran) == list(range(50))
        assert writes == 1 + 1 + 1  # the blocker, the 50 streams, the barrier
        waker.call(lambda: ran.append(50))
        loop_thread.run(_running_loop())
        assert ran[-1] == 50 and writes == 5
        # A stream's writer asked to wake twice before the loop ran wakes once.
        again = functools.partial(ran.append, 51)
        blocker.clear()
        loop.call_soon_threadsafe(blocker.wait, 10)
        waker.call(again)
        waker.call(again)
        blocker.set()
        loop_thread.run(_running_loop())
        assert ran.count(51) == 1 and writes == 8
        # While held (a batch's acknowledgements and commands), nothing wakes the loop,
        # even when it is idle; the hold's end wakes it once for all of them.
        with waker.held():
            for i in range(60, 70):
                waker.call(functools.partial(ran.append, i))
            with waker.held():  # holds nest: the outer end wakes
                waker.call(functools.partial(ran.append, 70))
            loop_thread.run(_running_loop())  # the loop runs, and finds nothing due
            assert writes == 9 and not set(range(60, 71)) & set(ran)
        loop_thread.run(_running_loop())
        assert ran[-11:] == list(range(60, 71)) and writes == 11
        with waker.held():  # a hold with nothing asked for wakes nothing
            pass
        assert writes == 11

        async def on_the_loop() -> None:  # asked on the loop's own thread: no write
            waker.call(functools.partial(ran.append, 80))

        loop_thread.run(on_the_loop())
        loop_thread.run(_running_loop())
        assert ran[-1] == 80 and writes == 13  # the two runs' own writes only
    finally:
        loop_thread.close()


async def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def test_agent_streams_hold_no_server_thread_each(server: HyperSackServer) -> None:
    """The streams are served on the event loop: connected agents leave the server with
    the threads of its bounded pool (their registrations ran there), fewer than the
    agents, where the synchronous server held a handler and a reader thread per agent."""

    def server_threads() -> int:
        return sum(t.name.startswith(("hypersack-rpc", "agent-"))
                   for t in threading.enumerate())

    before = server_threads()
    n = 70  # more than the pool's threads
    agents = [RawAgent(server.address) for _ in range(n)]
    try:
        for i, a in enumerate(agents):
            a.register(f"n{i}")
        for a in agents:
            msg = a.next()
            assert isinstance(msg, pb.ServerMessage) and msg.WhichOneof("body") == "registered"
        with Client(server.address) as c:
            _wait(lambda: sum(node.connected for node in c.nodes()) == n)
            assert server_threads() - before < n
            # and each stream still carries messages both ways
            c.submit(SLEEP_SPACE, "tiny.yaml")
            launched: list[pb.LaunchTrial] = []
            deadline = time.monotonic() + 20
            while len(launched) < 4 and time.monotonic() < deadline:
                for a in agents:
                    while not a.down.empty():
                        msg = a.next()
                        assert isinstance(msg, pb.ServerMessage), msg
                        if msg.WhichOneof("body") == "launch":
                            launched.append(msg.launch)
                time.sleep(0.05)
            assert len(launched) == 4
    finally:
        for a in agents:
            a.close()


def test_the_grpc_loops_lag_is_measured_where_work_holds_it() -> None:
    # A callback that holds the loop for 0.3 s makes the next timer run at least that
    # late: what an agent's message queued behind it waits.
    from hypersack.server.bridge import watch_lag

    loop_thread = LoopThread("test-lag")
    lags: list[float] = []
    try:
        loop_thread.post(watch_lag(lags.append, period_s=0.01))
        _wait(lambda: len(lags) >= 3)
        loop_thread.loop.call_soon_threadsafe(time.sleep, 0.3)
        _wait(lambda: max(lags) >= 0.25)
    finally:
        loop_thread.close()
