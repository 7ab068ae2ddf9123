"""The server's wiring: drives the orchestrator in real time, under one lock.

Agent sessions receive the commands the orchestrator returns; watchers are woken on
every change; a ticker thread sends `Tick` so silent nodes are noticed and pending
work is retried. Nothing here decides what runs where: that is the orchestrator's.
"""

from __future__ import annotations

import collections
import gc
import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

from pydantic import ValidationError

from hypersack._proto.v1 import hypersack_pb2 as pb
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
    KillTrial,
    ProfileWorkload,
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
)
from hypersack.orchestrator.orchestrator import BatchResult
from hypersack.policies import kernels
from hypersack.policies.registry import policy_names
from hypersack.sampler.profiles import select_profiles, to_import
from hypersack.server.gcpolicy import FullCollections
from hypersack.server.intake import BEATS_PER_BATCH as BEATS_PER_BATCH  # where it was
from hypersack.server.intake import MAX_OUTBOX as MAX_OUTBOX
from hypersack.server.intake import MAX_RUNNING_PER_NODE as MAX_RUNNING_PER_NODE
from hypersack.server.intake import AgentSession as AgentSession
from hypersack.server.intake import Intake, launched_trials, to_message
from hypersack.server.metrics import LatencyHistograms
from hypersack.server.threads import name_os_thread
from hypersack.server.watches import Snapshot, Watches
from hypersack.store.base import Store
from hypersack.wire.convert import node_from_register

log = logging.getLogger(__name__)

MAX_SPACE_BYTES = 1 << 20
MAX_RETRY = 200_000  # agents' events kept while the store fails


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
                 max_agents: int = 512, batch_gather_s: float = 0.0) -> None:
        self._clock = clock or SystemClock()
        self._lock = threading.RLock()
        self.orch = Orchestrator(store, self._clock, config)
        self._sessions: dict[str, AgentSession] = {}
        self.heartbeat_interval_s = heartbeat_interval_s
        self.tick_interval_s = tick_interval_s
        self.default_retries = default_retries
        self.max_study_trials = max_study_trials
        self._stop = threading.Event()
        self._tick_now = threading.Event()  # poke(): tick before the interval is over
        self._ticker: threading.Thread | None = None
        self.stats = {"events": 0, "heartbeats": 0, "stale": 0, "refused": 0, "batches": 0,
                      "failed_batches": 0, "profile_jobs": 0, "profiles_failed": 0}
        # The agents' messages, grouped into batches (gathered under load).
        self.intake = Intake(batch_gather_s)
        # Seconds from an exit's arrival to the end of the batch that handled it (its
        # decision taken, committed and the launches queued to the streams): the server's
        # own share of the exit-to-relaunch delay. The latest 100,000.
        self.exit_latency: collections.deque[float] = collections.deque(maxlen=100_000)
        # Seconds each batch took, lock held (the latest 100,000).
        self.batch_time: collections.deque[float] = collections.deque(maxlen=100_000)
        self.histograms = LatencyHistograms()  # the same, and the decisions, for /metrics
        # The clients' watches of studies, woken after every batch.
        self.watches = Watches(self._lock, self.snapshot, self._stop, max_watches)
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
        # Set by the agents' servicer (bridge.Waker.held): the wake-ups of the streams
        # a batch writes to wait for its end, and the loop is woken once.
        self.hold_wakes: Callable[[], AbstractContextManager[None]] = nullcontext
        self._retry: list[Event] = []
        self.full_gc = FullCollections(on_gc=self.histograms.on_gc)

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self.full_gc.start()
        # pack's compiled knapsacks (also auto's), compiled off the decision thread when
        # first asked: its decisions run the plain kernels until they are ready.
        kernels.in_background()
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
        name_os_thread()
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
        self._tick_now.set()
        with self._lock:
            for s in self._sessions.values():
                s.close()
            self.watches.wake()
        for thread in (self._ticker, self._worker):
            if thread is not None:
                thread.join(timeout=5)
        self.full_gc.stop()

    def poke(self) -> None:
        """Tick now (from any thread): something a tick takes in has happened (a
        simulation's answer came: orchestrator/foresight.py)."""
        self._tick_now.set()

    def _tick_loop(self) -> None:
        wait_s = self.tick_interval_s
        while True:
            self._tick_now.wait(wait_s)
            self._tick_now.clear()
            if self._stop.is_set():
                return
            with self._lock:
                self._apply_retrying(Tick())
                # Sessions of nodes that are gone are forgotten, not kept for ever.
                for name in [n for n, s in self._sessions.items()
                             if not s.connected and not self.orch.has_node(n)]:
                    del self._sessions[name]
                wake = self.orch.wake_at()  # a held promotion or study's time, if sooner
            wait_s = self.tick_interval_s if wake is None else \
                min(self.tick_interval_s, max(0.01, wake - self._clock.now()))
            self.full_gc.due_now()  # the collector's full collections: see gcpolicy

    # ----------------------------------------------------------------- core
    def _apply_retrying(self, *events: Event, committed: Callable[[], None] | None = None
                        ) -> BatchResult | None:
        """Apply the agents' events with those of batches the store failed; if it fails
        again, keep them all for the next try (at most MAX_RETRY, the newest; heartbeats
        and ticks are not kept: the next ones say the same). None: the store failed."""
        batch = (*self._retry, *events)
        try:
            result = self._apply(*batch, committed=committed)
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

    def _apply(self, *events: Event, committed: Callable[[], None] | None = None
               ) -> BatchResult:
        """Hand events to the orchestrator, which decides once after all of them, and
        deliver the commands (lock held); `committed` runs once the batch is committed,
        before its commands are queued. A stale event is logged and changes nothing.
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
            log.log(logging.INFO if stale.expected else logging.WARNING,
                    "ignored an event: %s", stale)
        if committed is not None:
            committed()
        self._route(result.commands)
        self.watches.changed()
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
                msg = to_message(c)
                if isinstance(c, ProfileWorkload):
                    self.stats["profile_jobs"] += 1
                if isinstance(c, KillTrial):
                    session.send_kill(msg, time.monotonic())
                else:
                    session.send(msg, launched_trials(c))
            except Exception:
                log.exception("%s for node %s not sent: it could not be encoded",
                              type(c).__name__, c.node)

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
            session = AgentSession.of(msg, spec, self._clock.now())
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
            self.watches.wake()
        if not self._stop.is_set():
            log.warning("agent %s disconnected; its node is lost unless it reconnects "
                        "within the heartbeat timeout", session.node)

    def agent_message(self, session: AgentSession, msg: pb.AgentMessage) -> None:
        """Queue one message from an agent; the event worker applies queued messages in
        batches (Intake.next_batch) and decides once per batch."""
        self.intake.put(session, msg)

    def _event_loop(self) -> None:
        while not self._stop.is_set():
            items = self.intake.next_batch()
            if not items:
                continue
            with self._lock:
                began = time.monotonic()
                events = []
                for session, msg, _ in items:
                    try:
                        event = self.intake.event_of(session, msg, self._clock.now(),
                                                     self.orch.has_node, self.stats)
                    except HyperSackError as exc:
                        log.warning("agent %s: refused message: %s", session.node, exc)
                        continue
                    except Exception:
                        log.exception("agent %s: refused a message it could not read",
                                      session.node)
                        continue
                    if event is not None:
                        events.append(event)
                # The acknowledgements ride with the commands the batch queues for the
                # same agents (an exit's, with its successor's launch).
                acked: list[AgentSession] = []
                committed = partial(self.intake.acknowledge, items, acked)
                # Every stream the batch writes to is woken with one wake-up of the loop.
                with self.hold_wakes():
                    if self._apply_retrying(*events, committed=committed) is not None:
                        for session in acked:
                            session.wake()
            done = time.monotonic()
            self.batch_time.append(done - began)
            self.histograms.batch.observe(done - began)
            for _, msg, at in items:
                if msg.WhichOneof("body") == "exited":
                    self.exit_latency.append(done - at)
                    self.histograms.exit.observe(done - at)

def _reason(result: BatchResult, source: str) -> HyperSackError:
    """The core's reason for refusing a client's event, as the client will read it: a
    domain error as it is; anything else (a bug) as a failure that names the log."""
    exc = result.refused[0][1]
    if isinstance(exc, HyperSackError):
        return exc
    return HyperSackError(f"{source}: the server failed to handle it ({type(exc).__name__}: "
                          f"{str(exc)[:200]}); its log has the traceback")
