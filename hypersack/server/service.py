"""The server's wiring: drives the orchestrator in real time, under one lock.

Agent sessions receive the commands the orchestrator returns; watchers are woken on
every change; a ticker thread sends `Tick` so silent nodes are noticed and pending
work is retried. Nothing here decides what runs where: that is the orchestrator's.
"""

from __future__ import annotations

import collections
import gc
import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.core.bounds import clamp
from hypersack.core.clock import Clock, SystemClock
from hypersack.core.errors import (
    AlreadyExists,
    HyperSackError,
    InvalidInput,
    NotFound,
    Overloaded,
    PermissionDenied,
    StoreUnavailable,
)
from hypersack.core.files import load_yaml
from hypersack.core.types import (
    NodeRecord,
    NodeSpec,
    Profile,
    StudyRecord,
    TrialRecord,
)
from hypersack.core.validation import format_validation_error
from hypersack.grid.runnable import check_runnable
from hypersack.grid.space import parse_space
from hypersack.orchestrator import Orchestrator, OrchestratorConfig
from hypersack.orchestrator.commands import (
    Command,
    DropCheckpoint,
    KillTrial,
    LaunchGroup,
    LaunchTrial,
    ProfileWorkload,
    launched,
)
from hypersack.orchestrator.events import (
    Event,
    Heartbeat,
    NodeDrained,
    NodeJoined,
    ProfileFailed,
    ProfilesForgotten,
    ProfilesImported,
    RunningTrial,
    StudyCancelled,
    StudyExtended,
    StudySubmitted,
    Tick,
    TrialsAsked,
    TrialStarted,
)
from hypersack.orchestrator.orchestrator import BatchResult
from hypersack.policies.registry import policy_names
from hypersack.sampler.profiles import select_profiles, to_import
from hypersack.server.metrics import LatencyHistograms
from hypersack.server.reports import exit_event, profile_event, progress_event
from hypersack.store.base import Store
from hypersack.wire.convert import (
    ack_id,
    clean_memory,
    clean_percent,
    clean_running,
    key_to_pb,
    node_from_register,
    program_to_pb,
)

log = logging.getLogger(__name__)

SHARING_MODES = ("mps", "time-slicing")

MAX_SPACE_BYTES = 1 << 20
MAX_RUNNING_PER_NODE = 20_000  # trials one heartbeat may list
BEATS_PER_BATCH = 64  # heartbeats one batch applies, unless they waited (next_batch)
BEAT_WAIT_MAX_S = 1.0
MAX_WATCH_INTERVAL_S = 60.0
MAX_RETRY = 200_000  # agents' events kept while the store fails
MAX_OUTBOX = 20_000  # messages queued for one agent; past it, it does not read: cut
KILL_COALESCE_S = 10.0
MAX_KILLS_REMEMBERED = 4096


def _launched(c: Command) -> tuple[RunningTrial, ...]:
    """The trials a command launches, as a heartbeat would list them."""
    return tuple(RunningTrial(m.trial_id, m.gpu_index, attempt=m.attempt)
                 for m in launched([c]))


@dataclass
class AgentSession:
    node: str
    backend: str
    spec: NodeSpec
    outbox: queue.Queue[pb.ServerMessage | None] = field(default_factory=queue.Queue)
    connected: bool = True
    last_seen: float = 0.0
    gpu_state: dict[int, pb.GpuState] = field(default_factory=dict)
    # Its latest heartbeat's list of running trials, as received and as cleaned.
    beat_listed: bytes = b""
    beat_running: tuple[RunningTrial, ...] = ()

    # Called after each message queued: the stream's writer on the event loop is woken.
    on_send: Callable[[], None] | None = None
    # Called (once) when the agent reads too slowly: its stream is cut.
    on_overflow: Callable[[], None] | None = None
    overflowed: bool = False
    # Kills sent lately, by (trial, attempt): a repeated one within KILL_COALESCE_S is
    # not queued again (a node that lists a trial until its kill lands, or a rogue).
    kills_sent: dict[tuple[str, int], float] = field(default_factory=dict)
    # Messages put on its stream so far, in the order the agent reads them, and the
    # launches among them with their place: until a heartbeat says the agent handled
    # that many, their trials are on the way, not missing from its list.
    queued: int = 0
    in_flight: deque[tuple[int, tuple[RunningTrial, ...]]] = field(
        default_factory=lambda: deque(maxlen=MAX_OUTBOX))
    flight_lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, msg: pb.ServerMessage, trials: tuple[RunningTrial, ...] = ()) -> None:
        """Queue a message; `trials`: what it launches."""
        if self.overflowed:
            return
        if self.outbox.qsize() >= MAX_OUTBOX:
            self._overflow()
            return
        with self.flight_lock:
            self.outbox.put(msg)
            self.queued += 1
            if trials:
                self.in_flight.append((self.queued, trials))
        self._woken()

    def put_first(self, msg: pb.ServerMessage) -> None:
        """Queue a message ahead of everything queued (the registration's answer)."""
        with self.flight_lock:
            self.outbox.queue.appendleft(msg)
            self.queued += 1
            self.in_flight = deque(((at + 1, t) for at, t in self.in_flight),
                                   maxlen=MAX_OUTBOX)

    def on_the_way(self, processed: int, listed: set[str]) -> tuple[RunningTrial, ...]:
        """The trials launched past the `processed` messages the agent handled, and not
        in its list: still on their way to it (0: the agent does not say)."""
        if processed <= 0:
            return ()
        with self.flight_lock:
            while self.in_flight and self.in_flight[0][0] <= processed:
                self.in_flight.popleft()
            return tuple(r for _, trials in self.in_flight for r in trials
                         if r.trial_id not in listed)

    def send_kill(self, msg: pb.ServerMessage, now: float) -> bool:
        """Queue a kill unless the same was queued within KILL_COALESCE_S."""
        key = (msg.kill.trial_id, msg.kill.attempt)
        last = self.kills_sent.get(key)
        if last is not None and now - last < KILL_COALESCE_S:
            return False
        if len(self.kills_sent) >= MAX_KILLS_REMEMBERED:
            self.kills_sent = {k: t for k, t in self.kills_sent.items()
                               if now - t < KILL_COALESCE_S}
        self.kills_sent[key] = now
        self.send(msg)
        return True

    def _overflow(self) -> None:
        """The agent does not read what it is sent: drop its queue and cut its stream.
        It is no longer connected; its node is lost unless it reconnects in time."""
        self.overflowed = True
        self.connected = False
        log.warning("agent %s reads too slowly (%d messages queued): its stream is cut",
                    self.node, self.outbox.qsize())
        self.drain()
        self.outbox.put(None)
        self._woken()
        if self.on_overflow is not None:
            self.on_overflow()

    def close(self) -> None:
        """End the stream once what is queued before has been sent."""
        self.outbox.put(None)
        self._woken()

    def _woken(self) -> None:
        on_send = self.on_send
        if on_send is not None:
            on_send()

    def drain(self) -> list[pb.ServerMessage | None]:
        """What is queued to send now, in order (None: the stream ends there)."""
        out: list[pb.ServerMessage | None] = []
        while True:
            try:
                out.append(self.outbox.get_nowait())
            except queue.Empty:
                return out


# A message from an agent's stream, waiting for the event worker: its session, the
# message, and when it arrived.
Queued = tuple[AgentSession, pb.AgentMessage, float]


@dataclass(frozen=True)
class Snapshot:
    study: StudyRecord
    counts: dict[str, int]
    gpus: list[tuple[str, int, int, float]]


def keep_out_of_gc() -> None:
    """Move every object alive now out of the cyclic collector's reach. A study's trial
    records live long: a full collection walking 10,000 of them paused decisions for
    100-150 ms (scripts/bench_decisions.py, p99). Reference counting still frees them
    when they are replaced; only cycles among them would stay, and records have none.
    Garbage already there is collected first, so that freezing leaks none of it."""
    gc.collect()
    gc.freeze()


class SchedulerService:
    def __init__(self, store: Store, config: OrchestratorConfig | None = None, *,
                 clock: Clock | None = None, heartbeat_interval_s: float = 5.0,
                 tick_interval_s: float = 1.0, default_retries: int | None = None,
                 max_study_trials: int = 100_000, max_watches: int = 32,
                 max_agents: int = 512) -> None:
        self._clock = clock or SystemClock()
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._version = 0
        self.orch = Orchestrator(store, self._clock, config)
        self._sessions: dict[str, AgentSession] = {}
        self.heartbeat_interval_s = heartbeat_interval_s
        self.tick_interval_s = tick_interval_s
        self.default_retries = default_retries
        self.max_study_trials = max_study_trials
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.stats = {"events": 0, "heartbeats": 0, "stale": 0, "refused": 0, "batches": 0,
                      "failed_batches": 0, "profile_jobs": 0, "profiles_failed": 0}
        self._inbox: queue.Queue[Queued] = queue.Queue()
        # Heartbeats waiting for a batch, the latest per node, oldest first (next_batch).
        self._beats: dict[str, Queued] = {}
        # Seconds from an exit's arrival to the end of the batch that handled it (its
        # decision taken, committed and the launches queued to the streams): the server's
        # own share of the exit-to-relaunch delay. The latest 100,000.
        self.exit_latency: collections.deque[float] = collections.deque(maxlen=100_000)
        # Seconds each batch took, lock held (the latest 100,000).
        self.batch_time: collections.deque[float] = collections.deque(maxlen=100_000)
        self.histograms = LatencyHistograms()  # the same, and the decisions, for /metrics
        self.max_watches = max_watches
        self.max_watches_per_client = max(1, max_watches // 4)
        self._watches: dict[str, int] = {}
        self._worker: threading.Thread | None = None
        self.max_agents = max_agents
        # Set when a loop stops for good: the health service says NOT_SERVING and the
        # daemon exits non-zero so that its supervisor restarts it.
        self.fatal: str | None = None
        self.on_fatal: Callable[[str], None] | None = None
        # While the store fails: why (health says NOT_SERVING, writes answer UNAVAILABLE);
        # the agents' events of the undone batches, applied again with the next batch (a
        # tick's at the latest), so that an exit is not lost to a full or read-only disk.
        self.store_failure: str | None = None
        self.on_store: Callable[[str | None], None] | None = None
        self._retry: list[Event] = []

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        keep_out_of_gc()  # what the orchestrator restored
        self._ticker = threading.Thread(target=self._supervised, args=(self._tick_loop,),
                                        name="hypersack-ticker", daemon=True)
        self._ticker.start()
        self._worker = threading.Thread(target=self._supervised, args=(self._event_loop,),
                                        name="hypersack-events", daemon=True)
        self._worker.start()

    def _supervised(self, loop: Callable[[], None]) -> None:
        """Run a loop; if it ever stops before stop() (it should not: each event and
        tick is guarded), say so loudly and tell the daemon to exit."""
        try:
            loop()
        except BaseException as exc:
            self.fatal = f"{threading.current_thread().name} stopped: {exc!r}"
            log.critical("%s; the server cannot go on", self.fatal, exc_info=True)
            if self.on_fatal is not None:
                self.on_fatal(self.fatal)
            return
        if not self._stop.is_set():
            self.fatal = f"{threading.current_thread().name} stopped"
            if self.on_fatal is not None:
                self.on_fatal(self.fatal)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for s in self._sessions.values():
                s.close()
            self._changed.notify_all()
        for thread in (self._ticker, self._worker):
            if thread is not None:
                thread.join(timeout=5)

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.tick_interval_s):
            with self._lock:
                self._apply_retrying(Tick())
                # Sessions of nodes that are gone are forgotten, not kept for ever.
                for name in [n for n, s in self._sessions.items()
                             if not s.connected and not self.orch.has_node(n)]:
                    del self._sessions[name]

    # ----------------------------------------------------------------- core
    def _apply_retrying(self, *events: Event) -> BatchResult | None:
        """Apply the agents' events with those of batches the store failed; if it fails
        again, keep them all for the next try (at most MAX_RETRY, the newest; heartbeats
        and ticks are not kept: the next ones say the same). None: the store failed."""
        batch = (*self._retry, *events)
        try:
            result = self._apply(*batch)
        except StoreUnavailable:
            kept: list[Event] = [e for e in batch if not isinstance(e, (Tick, Heartbeat))]
            if len(kept) > MAX_RETRY:
                log.error("%d events of undone batches dropped (at most %d are kept)",
                          len(kept) - MAX_RETRY, MAX_RETRY)
            self._retry = kept[-MAX_RETRY:]
            return None
        except HyperSackError:
            self._retry = []  # the batch failed for itself (logged): not tried again
            return None
        self._retry = []
        return result

    def _apply(self, *events: Event) -> BatchResult:
        """Hand events to the orchestrator, which decides once after all of them, and
        deliver the commands (lock held). A stale event is logged and changes nothing.
        Raises StoreUnavailable when the store failed: the whole batch was undone."""
        try:
            result = self.orch.handle_batch(events)
        except StoreUnavailable as exc:
            # The orchestrator undid the whole batch, in memory and in the store.
            self.stats["failed_batches"] += 1
            if self.store_failure is None:
                log.error("the store failed, so a batch of %d events was undone; the server "
                          "answers NOT_SERVING until it works again: %s", len(events),
                          exc.detail)
                self._store_state(exc.detail)
            raise
        except Exception as exc:
            # Not the store, and no event's own refusal (those are in the result): the
            # batch was undone whole all the same; the loop goes on.
            self.stats["failed_batches"] += 1
            log.exception("a batch of %d events failed and was undone", len(events))
            raise HyperSackError(f"the server failed to handle it ({type(exc).__name__}); "
                                 "its log has the traceback") from exc
        if self.store_failure is not None:
            log.warning("the store works again; serving")
            self._store_state(None)
        self.stats["events"] += len(events) - len(result.stale) - len(result.refused)
        self.stats["profiles_failed"] += sum(isinstance(e, ProfileFailed) for e in events)
        self.stats["stale"] += len(result.stale)
        self.stats["refused"] += len(result.refused)
        self.stats["batches"] += 1
        self.histograms.observe_decisions(self)
        for stale in result.stale:
            log.warning("ignored an event: %s", stale)
        self._route(result.commands)
        self._version += 1
        self._changed.notify_all()
        return result

    def _store_state(self, failure: str | None) -> None:
        self.store_failure = failure
        if self.on_store is not None:
            self.on_store(failure)

    def _route(self, commands: list[Command]) -> None:
        for c in commands:
            session = self._sessions.get(c.node)
            if session is None or not session.connected:
                log.warning("%s for node %s not sent: its agent is not connected (it is "
                            "reconciled when the agent reconnects)", type(c).__name__, c.node)
                continue
            try:
                msg = self._to_message(c)
                if isinstance(c, KillTrial):
                    session.send_kill(msg, time.monotonic())
                else:
                    session.send(msg, _launched(c))
            except Exception:
                log.exception("%s for node %s not sent: it could not be encoded",
                              type(c).__name__, c.node)

    @staticmethod
    def _launch_pb(c: LaunchTrial) -> pb.LaunchTrial:
        """The command as it is: it carries all an agent needs (the core is not read)."""
        assert c.program is not None, "a launch carries its program"
        return pb.LaunchTrial(
            trial_id=c.trial_id, study_id=c.study_id, gpu_index=c.gpu_index,
            params_json=json.dumps(c.params, sort_keys=True), key=key_to_pb(c.key),
            epochs=c.epochs, program=program_to_pb(c.program),
            compute_pct=c.demand.compute_pct, memory_mib=c.demand.memory_mib,
            cores=c.demand.cores, attempt=c.attempt, owner=c.owner,
            stop_at_epoch=c.stop_at, done_epochs=c.done_epochs)

    def _to_message(self, c: Command) -> pb.ServerMessage:
        if isinstance(c, LaunchTrial):
            return pb.ServerMessage(launch=self._launch_pb(c))
        if isinstance(c, LaunchGroup):
            return pb.ServerMessage(launch_group=pb.LaunchGroup(
                group_id=c.group_id, gpu_index=c.gpu_index, key=key_to_pb(c.key),
                compute_pct=c.demand.compute_pct, memory_mib=c.demand.memory_mib,
                cores=c.demand.cores, members=[self._launch_pb(m) for m in c.members]))
        if isinstance(c, KillTrial):
            return pb.ServerMessage(kill=pb.KillTrial(trial_id=c.trial_id, reason=c.reason,
                                                      attempt=c.attempt))
        if isinstance(c, DropCheckpoint):
            return pb.ServerMessage(drop_checkpoint=pb.DropCheckpoint(
                trial_id=c.trial_id, study_id=c.study_id))
        assert isinstance(c, ProfileWorkload) and c.program is not None
        self.stats["profile_jobs"] += 1
        # Profiled with the trial the core chose (a fused width: a trial of the workload
        # alone, which the agent runs K times).
        return pb.ServerMessage(profile=pb.ProfileWorkload(
            key=key_to_pb(c.key), arch=c.arch, gpu_index=c.gpu_index, iterations=c.iterations,
            warmup=c.warmup, program=program_to_pb(c.program),
            params_json=json.dumps(c.params, sort_keys=True), epochs=c.epochs,
            owner=c.owner))

    # ----------------------------------------------------------------- clients
    def submit(self, text: str, source: str, owner: str = "", admin: bool = True
               ) -> StudyRecord:
        """A new study from a search space's text; `admin`: its owner may ask for any
        priority (others up to their `max_priority`)."""
        if len(text.encode()) > MAX_SPACE_BYTES:
            raise InvalidInput(f"{source}: search space larger than {MAX_SPACE_BYTES} bytes")
        space = parse_space(load_yaml(text, source), source=source, policies=policy_names())
        check_runnable(space, source)
        allowed = self.orch.config.share_rule(owner).max_priority
        if not admin and space.settings.priority > allowed:
            raise PermissionDenied(
                f"{source}: settings.priority {space.settings.priority} is above the "
                f"highest {owner or 'this user'} may ask for ({allowed}); an admin sets "
                "it in the server's `shares` setting")
        if space.size() > self.max_study_trials:
            raise InvalidInput(f"{source}: {space.size()} trials; this server accepts at most "
                               f"{self.max_study_trials} per study")
        if self.default_retries is not None and "retries" not in space.settings.model_fields_set:
            settings = space.settings.model_copy(update={"retries": self.default_retries})
            space = space.model_copy(update={"settings": settings})
        with self._lock:
            before = len(self.orch.studies())
            result = self._apply(StudySubmitted(space, owner))
            if result.refused:
                # Refused by the orchestrator (and undone): its reason, to whoever sent it.
                raise _reason(result, source)
            if len(self.orch.studies()) == before:
                raise HyperSackError(f"{source}: the study was not created")
            keep_out_of_gc()
            return self.orch.studies()[-1]

    def ask(self, study_id: str, params: list[dict[str, Any]]) -> list[TrialRecord]:
        """Trials with given parameters for a manual search; the new trials."""
        with self._lock:
            before = len(self.orch.trials(study_id))
            result = self._apply(TrialsAsked(study_id, tuple(params)))
            if result.refused:
                raise _reason(result, f"study {study_id}")
            return self.orch.trials(study_id)[before:]

    def explain(self, trial_id: str, others: bool = True) -> list[str]:
        with self._lock:
            return self.orch.explain(trial_id, others)

    def change_study(self, event: StudyCancelled | StudyExtended) -> StudyRecord:
        """Cancel or extend a study; a refusal comes back as its reason."""
        with self._lock:
            self.orch.study(event.study_id)
            result = self._apply(event)
            if result.refused:
                raise _reason(result, f"study {event.study_id}")
            return self.orch.study(event.study_id)

    def drain(self, node: str, draining: bool = True) -> NodeRecord:
        with self._lock:
            if node not in {n.spec.name for n in self.orch.nodes()}:
                raise NotFound(f"no node {node[:80]!r}")
            self._apply(NodeDrained(node, draining))
            return next(n for n in self.orch.nodes() if n.spec.name == node)

    def forget(self, model: str, arch: str = "") -> int:
        """Forget a workload's profiles and profile failures; how many were forgotten."""
        with self._lock:
            n = len(self.orch.known_slots(model, arch))
            if not n:
                raise NotFound(f"the history has nothing of workload {model[:80]!r}"
                               + (f" on {arch[:40]}" if arch else ""))
            self._apply(ProfilesForgotten(model, arch))
            return n

    def profiles(self, model: str = "", arch: str = "") -> list[Profile]:
        with self._lock:
            return select_profiles(self.orch.profiles(), model, arch)

    def import_profiles(self, profiles: list[Profile], replace: bool) -> tuple[int, int]:
        """(imported, kept): kept ones were in the history already and not replaced."""
        with self._lock:
            known = {(p.key, p.arch) for p in self.orch.profiles()}
            imported = len(to_import(profiles, known, replace))
            self._apply(ProfilesImported(tuple(profiles), replace))
            return imported, len(profiles) - imported

    def counts(self, study_id: str) -> dict[str, int]:
        with self._lock:
            return {s.value: n for s, n in self.orch.counts(study_id).items()}

    def snapshot(self, study_id: str) -> Snapshot:
        with self._lock:
            study = self.orch.study(study_id)
            gpus = [(node, idx, n, share)
                    for (node, idx), (n, share) in sorted(self.orch.gpu_load().items())]
            return Snapshot(study, self.counts(study_id), gpus)

    def watch(self, study_id: str, min_interval_s: float, active: Callable[[], bool]
              ) -> Iterator[Snapshot]:
        """Snapshots of a study as it changes, ending once it is terminal or the client
        is gone. The interval is clamped to [0, 60] s and waited for in steps of at most
        a second, so a cancelled watch never holds its thread for long."""
        interval = clamp(min_interval_s, 0.0, MAX_WATCH_INTERVAL_S, 1.0)
        self.snapshot(study_id)  # NotFound before the stream starts
        seen = -1
        while active() and not self._stop.is_set():
            with self._changed:
                if self._version == seen:
                    self._changed.wait(timeout=1.0)
                if self._version == seen:
                    continue
                seen = self._version
                snap = self.snapshot(study_id)
            yield snap
            if snap.study.state.value != "ACTIVE":
                return
            deadline = time.monotonic() + interval
            while active() and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                with self._changed:  # woken early by wake() when the client goes away
                    self._changed.wait(min(left, 0.5))

    def watching(self) -> int:
        """How many watches are open."""
        with self._lock:
            return sum(self._watches.values())

    def wake(self) -> None:
        """Wake every waiting watch (one of their clients went away)."""
        with self._changed:
            self._changed.notify_all()

    @contextmanager
    def watch_slot(self, client: str) -> Iterator[None]:
        """Hold one of the bounded watch slots: at most `max_watches` in all and
        `max_watches_per_client` per holder (a user; a client host without
        authentication); past that, Overloaded."""
        with self._lock:
            total = self.watching()
            mine = self._watches.get(client, 0)
            if total >= self.max_watches or mine >= self.max_watches_per_client:
                raise Overloaded(f"too many watches open ({total} in all, {mine} of {client}); "
                                 "close one or poll with hypersack status")
            self._watches[client] = mine + 1
        try:
            yield
        finally:
            with self._lock:
                self._watches[client] -= 1
                if not self._watches[client]:
                    del self._watches[client]

    def locked(self) -> threading.RLock:
        """The service's lock: hold it to read the orchestrator consistently."""
        return self._lock

    def since(self, t: float) -> float:
        return self._clock.now() - t

    def sessions(self) -> dict[str, AgentSession]:
        with self._lock:
            return dict(self._sessions)

    # ----------------------------------------------------------------- agents
    def register(self, msg: pb.Register) -> AgentSession:
        try:
            spec = node_from_register(msg)
        except ValidationError as exc:
            raise InvalidInput(format_validation_error(exc, "register")) from None
        indexes = [g.index for g in spec.gpus]
        if len(set(indexes)) != len(indexes):
            raise InvalidInput(f"register: GPU indexes repeat in {indexes}")
        with self._lock:
            old = self._sessions.get(spec.name)
            if old is not None and old.connected:
                raise AlreadyExists(f"node {spec.name!r} is already connected; every agent "
                                    "needs its own node name")
            if old is None and len(self._sessions) >= self.max_agents:
                raise Overloaded(f"this server takes at most {self.max_agents} agents "
                                 "(max_agents)")
            session = AgentSession(node=spec.name, backend=msg.backend or "?", spec=spec,
                                   last_seen=self._clock.now())
            running = tuple(RunningTrial(r.trial_id, r.gpu_index, attempt=r.attempt)
                            for r in msg.running)
            self._sessions[spec.name] = session
            try:
                self._apply(NodeJoined(spec, running))
            except HyperSackError:
                # Not joined: the agent is told UNAVAILABLE and dials again later.
                if old is None:
                    del self._sessions[spec.name]
                else:
                    self._sessions[spec.name] = old
                raise
            # First on the stream, before the commands the join caused.
            session.put_first(pb.ServerMessage(registered=pb.Registered(
                heartbeat_interval_s=self.heartbeat_interval_s,
                heartbeat_timeout_s=self.orch.config.heartbeat_timeout_s)))
            log.info("agent %s connected (%s backend, %d GPUs, %d trials still running)",
                     spec.name, session.backend, len(spec.gpus), len(running))
            return session

    def disconnected(self, session: AgentSession) -> None:
        with self._lock:
            session.connected = False
            session.close()
            self._changed.notify_all()
        if not self._stop.is_set():
            log.warning("agent %s disconnected; its node is lost unless it reconnects "
                        "within the heartbeat timeout", session.node)

    def agent_message(self, session: AgentSession, msg: pb.AgentMessage) -> None:
        """Queue one message from an agent; the event worker applies queued messages in
        batches and decides once per batch. A heartbeat is acknowledged on receipt, batch
        or no batch, store or no store: the agent's fence lease runs from it."""
        if session.overflowed:
            return  # its stream is cut: what it still sends counts for nothing
        if msg.WhichOneof("body") == "heartbeat" and msg.heartbeat.seq and session.connected:
            session.send(pb.ServerMessage(acked=pb.Acked(id=f"heartbeat:{msg.heartbeat.seq}")))
        self._inbox.put((session, msg, time.monotonic()))

    def next_batch(self, wait_s: float = 0.2) -> list[Queued]:
        """The messages one batch applies: every report waiting (up to 5,000), after at
        most BEATS_PER_BATCH heartbeats (more if they waited BEAT_WAIT_MAX_S), the
        oldest first. A heartbeat is a node's whole list of what runs, so a newer one
        from the same node replaces one still waiting; the rest wait for the next
        batches, except a node's heartbeat older than a report of its own in the batch,
        which goes with it: each node's messages are applied in the order it sent them
        (only other nodes' heartbeats wait). A thousand agents' heartbeats arriving
        together (their timers started together) cost hundreds of milliseconds to
        apply, and an exit behind them waited for all: now its trial's successor is
        decided in the first batch."""
        items: list[Queued] = []
        try:
            items.append(self._inbox.get(timeout=0 if self._beats else wait_s))
        except queue.Empty:
            pass
        while len(items) < 5000:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        urgent: list[Queued] = []
        for item in items:
            if item[1].WhichOneof("body") == "heartbeat":
                self._beats.pop(item[0].node, None)  # the newer one goes to the back
                self._beats[item[0].node] = item
            else:
                urgent.append(item)
        beats: list[Queued] = []
        # A node's heartbeat older than a report of its own in this batch goes with it:
        # each node's messages are applied in the order it sent them.
        for item in urgent:
            held = self._beats.get(item[0].node)
            if held is not None and held[2] <= item[2]:
                beats.append(self._beats.pop(item[0].node))
        # Past the cap, those that waited a second go too: a node is never taken for
        # silent because its heartbeats wait behind others.
        overdue = time.monotonic() - BEAT_WAIT_MAX_S
        while self._beats:
            node, oldest = next(iter(self._beats.items()))
            if len(beats) >= BEATS_PER_BATCH and oldest[2] > overdue:
                break
            beats.append(self._beats.pop(node))
        return sorted(beats + urgent, key=lambda item: item[2])  # as they arrived

    def _event_loop(self) -> None:
        while not self._stop.is_set():
            items = self.next_batch()
            if not items:
                continue
            with self._lock:
                began = time.monotonic()
                events = []
                for session, msg, _ in items:
                    try:
                        event = self._event_of(session, msg)
                    except HyperSackError as exc:
                        log.warning("agent %s: refused message: %s", session.node, exc)
                        continue
                    except Exception:
                        log.exception("agent %s: refused a message it could not read",
                                      session.node)
                        continue
                    if event is not None:
                        events.append(event)
                if self._apply_retrying(*events) is not None:
                    self._acknowledge(items)
            done = time.monotonic()
            self.batch_time.append(done - began)
            self.histograms.batch.observe(done - began)
            for _, msg, at in items:
                if msg.WhichOneof("body") == "exited":
                    self.exit_latency.append(done - at)
                    self.histograms.exit.observe(done - at)

    @staticmethod
    def _acknowledge(items: list[tuple[AgentSession, pb.AgentMessage, float]]) -> None:
        """Tell each agent which of its reports the batch committed (applied, or stale or
        refused: sending them again would change nothing); it stops sending those. A batch
        the store undid acknowledges nothing, and the agent sends them again."""
        for session, msg, _ in items:
            ack = ack_id(msg)
            if ack is not None and session.connected:
                session.send(pb.ServerMessage(acked=pb.Acked(id=ack)))

    def _event_of(self, session: AgentSession, msg: pb.AgentMessage) -> Event | None:
        kind = msg.WhichOneof("body")
        node = session.node
        session.last_seen = self._clock.now()
        if kind == "heartbeat":
            self.stats["heartbeats"] += 1
            hb = msg.heartbeat
            if len(hb.running) > MAX_RUNNING_PER_NODE:
                raise InvalidInput(f"heartbeat: {len(hb.running)} running trials; at most "
                                   f"{MAX_RUNNING_PER_NODE}")
            known = {g.index for g in session.spec.gpus}
            for g in hb.gpus:
                if g.index in known:  # only the GPUs it registered: no unbounded growth
                    session.gpu_state[g.index] = pb.GpuState(
                        index=g.index, utilization_pct=clean_percent(g.utilization_pct),
                        memory_used_mib=clean_memory(g.memory_used_mib),
                        sharing=g.sharing if g.sharing in SHARING_MODES else "",
                        mps_restarts=max(0, min(g.mps_restarts, 1_000_000)))
            # A node lists the same trials beat after beat: the list's cleaned form is
            # kept and used again while its bytes repeat (cleaning 48 trials costs about
            # 60 us, which a thousand nodes' beats a second made 6 % of a server core).
            processed = hb.processed
            hb.ClearField("gpus")  # read above
            hb.ClearField("seq")  # acknowledged on receipt
            hb.ClearField("processed")  # grows with every message the agent reads
            listed = hb.SerializeToString()  # the list alone
            if listed != session.beat_listed:
                session.beat_listed = listed
                session.beat_running = clean_running(hb.running, RunningTrial)
            running = session.beat_running
            # Launches the agent had not yet handled when it listed what runs: on their
            # way, not missing (under load the server's queue to it may lag seconds).
            running += session.on_the_way(processed, {r.trial_id for r in running})
            if not session.connected:
                return None
            if not self.orch.has_node(node):
                # Declared lost (silent too long) but alive: it joins again.
                log.warning("node %s was lost but its agent is alive; it joins again", node)
                return NodeJoined(session.spec, running)
            return Heartbeat(node, running)
        if kind == "started":
            return TrialStarted(msg.started.trial_id, node, msg.started.attempt)
        if kind == "metrics":
            return progress_event(node, msg.metrics)
        if kind == "exited":
            return exit_event(node, msg.exited)
        if kind == "profile":
            return profile_event(node, msg.profile)
        if kind == "register":
            raise InvalidInput("register: already registered on this stream")
        raise InvalidInput("empty agent message")


def _reason(result: BatchResult, source: str) -> HyperSackError:
    """The core's reason for refusing a client's event, as the client will read it: a
    domain error as it is; anything else (a bug) as a failure that names the log."""
    exc = result.refused[0][1]
    if isinstance(exc, HyperSackError):
        return exc
    return HyperSackError(f"{source}: the server failed to handle it ({type(exc).__name__}: "
                          f"{str(exc)[:200]}); its log has the traceback")
