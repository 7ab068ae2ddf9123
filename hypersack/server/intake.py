"""What comes from the agents and goes to them: a session per connected agent (its
outbox, what is on the way to it), the commands as the agents receive them, and the
intake that groups the agents' messages into the batches the event worker applies
(heartbeats capped per batch, each node's messages in the order it sent them), each
message read into the orchestrator's event.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.core.errors import InvalidInput
from hypersack.core.types import NodeSpec
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
    NodeJoined,
    RunningTrial,
)
from hypersack.server.reports import exit_event, profile_event, progress_event
from hypersack.wire.convert import (
    HEARTBEAT_ACK,
    ack_id,
    clean_memory,
    clean_percent,
    clean_running,
    heartbeat_ack,
    key_to_pb,
    program_to_pb,
)

log = logging.getLogger("hypersack.server.service")

SHARING_MODES = ("mps", "time-slicing")
MAX_RUNNING_PER_NODE = 20_000  # trials one heartbeat may list
BEATS_PER_BATCH = 64  # heartbeats one batch applies, unless they waited (next_batch)
BEAT_WAIT_MAX_S = 1.0
MAX_OUTBOX = 20_000  # messages queued for one agent; past it, it does not read: cut
# Queued messages written as one (Register.batched): at most this many, and no more
# once their bytes reach MAX_BATCH_BYTES (gRPC refuses a message of 4 MiB).
MAX_BATCH = 512
MAX_BATCH_BYTES = 1 << 20
# Acknowledgements held for an agent's next message (Register.held_acks): past this many
# they are written at once, whether or not its heartbeats come (an agent that numbers
# none, or floods reports, never makes the server keep more).
MAX_HELD_ACKS = 256
KILL_COALESCE_S = 10.0
MAX_KILLS_REMEMBERED = 4096


def launched_trials(c: Command) -> tuple[RunningTrial, ...]:
    """The trials a command launches, as a heartbeat would list them."""
    return tuple(RunningTrial(m.trial_id, m.gpu_index, attempt=m.attempt)
                 for m in launched([c]))


@dataclass
class AgentSession:
    node: str
    backend: str
    spec: NodeSpec
    # What is queued for its stream, oldest first (None: the stream ends there). A deque:
    # appends and pops are atomic, without the condition a queue.Queue takes per call.
    outbox: deque[pb.ServerMessage | None] = field(default_factory=deque)
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
    # It reads acknowledgements carried with other messages (Register.folded_acks): those
    # not yet on the stream, sent with whatever is written to it next (drain).
    folded_acks: bool = False
    acks: list[str] = field(default_factory=list)
    # It waits for a report's acknowledgement (Register.held_acks): one is not written
    # alone but held for the next message, at the latest its next heartbeat's
    # acknowledgement. It reads several messages written as one (Register.batched).
    held_acks: bool = False
    batched: bool = False

    @classmethod
    def of(cls, msg: pb.Register, spec: NodeSpec, now: float) -> AgentSession:
        """The session of an agent that registered (`spec`: its message, checked)."""
        return cls(node=spec.name, backend=msg.backend or "?", spec=spec, last_seen=now,
                   folded_acks=msg.folded_acks, held_acks=msg.held_acks,
                   batched=msg.batched)

    def send(self, msg: pb.ServerMessage, trials: tuple[RunningTrial, ...] = ()) -> None:
        """Queue a message; `trials`: what it launches."""
        if self.overflowed:
            return
        if len(self.outbox) >= MAX_OUTBOX:
            self._overflow()
            return
        with self.flight_lock:
            self.outbox.append(msg)
            self.queued += 1
            if trials:
                self.in_flight.append((self.queued, trials))
        self.wake()

    def ack(self, ack: str, wake: bool = True) -> None:
        """Acknowledge a report: carried with the next message written to the agent, or
        in one of their own if nothing else is (an agent that folds acknowledgements),
        else as an Acked message. `wake`: the stream's writer now (False: the caller
        queues more first, then `wake`s it)."""
        if not self.folded_acks:
            self.send(pb.ServerMessage(acked=pb.Acked(id=ack)))
            return
        if self.overflowed:
            return
        with self.flight_lock:
            if len(self.acks) >= MAX_OUTBOX:
                del self.acks[0]  # the agent sends that report again
            self.acks.append(ack)
        if wake:
            self.wake()

    def put_first(self, msg: pb.ServerMessage) -> None:
        """Queue a message ahead of everything queued (the registration's answer)."""
        with self.flight_lock:
            self.outbox.appendleft(msg)
            self.queued += 1
            self.in_flight = deque(((at + 1, t) for at, t in self.in_flight),
                                   maxlen=MAX_OUTBOX)

    def on_the_way(self, processed: int, running: tuple[RunningTrial, ...]
                   ) -> tuple[RunningTrial, ...]:
        """The trials launched past the `processed` messages the agent handled, and not
        in its list `running`: still on their way to it (0: the agent does not say)."""
        if processed <= 0:
            return ()
        with self.flight_lock:
            while self.in_flight and self.in_flight[0][0] <= processed:
                self.in_flight.popleft()
            if not self.in_flight:
                return ()  # most beats: no set of the list's ids to build
            listed = {r.trial_id for r in running}
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
                    self.node, len(self.outbox))
        self.drain()
        self.outbox.append(None)
        self.wake()
        if self.on_overflow is not None:
            self.on_overflow()

    def close(self) -> None:
        """End the stream once what is queued before has been sent."""
        self.outbox.append(None)
        self.wake()

    def wake(self) -> None:
        """Have the stream's writer send what is queued (the acknowledgements too)."""
        on_send = self.on_send
        if on_send is not None:
            on_send()

    def drain(self) -> list[pb.ServerMessage | None]:
        """What is queued to send now, in order (None: the stream ends there)."""
        out: list[pb.ServerMessage | None] = []
        outbox = self.outbox
        while outbox:
            try:
                out.append(outbox.popleft())
            except IndexError:  # taken meanwhile (an overflow's drain)
                break
        with self.flight_lock:
            acks, self.acks = self.acks, []
        if acks:
            # With the first message drained (the writer's own from here on), or alone.
            first = next((m for m in out if m is not None), None)
            if first is None:
                out.insert(0, pb.ServerMessage(acks=acks))
            else:
                first.acks.extend(acks)
        return batched(out) if self.batched and len(out) > 1 else out

    def wants_wake(self, ack: str) -> bool:
        """Whether an acknowledgement needs a message written now: not a report's to an
        agent that holds them (it goes with the next message; a heartbeat's, at the
        latest, which wakes the writer), unless MAX_HELD_ACKS wait."""
        return not self.held_acks or ack.startswith(HEARTBEAT_ACK) or \
            len(self.acks) >= MAX_HELD_ACKS


def batched(out: list[pb.ServerMessage | None]) -> list[pb.ServerMessage | None]:
    """Runs of queued messages as one message each (ServerMessage.more): each costs the
    stream loop about the same whatever its size. The stream's end (None) stays in its
    place; a run ends at MAX_BATCH messages or MAX_BATCH_BYTES."""
    packed: list[pb.ServerMessage | None] = []
    head: pb.ServerMessage | None = None
    count = size = 0
    for msg in out:
        if msg is None:
            packed.append(None)
            head = None
            continue
        n = msg.ByteSize()
        if head is None or count >= MAX_BATCH or size + n > MAX_BATCH_BYTES:
            packed.append(msg)
            head, count, size = msg, 1, n
            continue
        head.more.append(msg)
        count += 1
        size += n
    return packed


# A message from an agent's stream, waiting for the event worker: its session, the
# message, and when it arrived.
Queued = tuple[AgentSession, pb.AgentMessage, float]


def launch_pb(c: LaunchTrial) -> pb.LaunchTrial:
    """The command as it is: it carries all an agent needs (the core is not read)."""
    assert c.program is not None, "a launch carries its program"
    return pb.LaunchTrial(
        trial_id=c.trial_id, study_id=c.study_id, gpu_index=c.gpu_index,
        params_json=json.dumps(c.params, sort_keys=True), key=key_to_pb(c.key),
        epochs=c.epochs, program=program_to_pb(c.program),
        compute_pct=c.demand.compute_pct, memory_mib=c.demand.memory_mib,
        cores=c.demand.cores, attempt=c.attempt, owner=c.owner,
        stop_at_epoch=c.stop_at, done_epochs=c.done_epochs)


def to_message(c: Command) -> pb.ServerMessage:
    """A command as its agent receives it."""
    if isinstance(c, LaunchTrial):
        return pb.ServerMessage(launch=launch_pb(c))
    if isinstance(c, LaunchGroup):
        return pb.ServerMessage(launch_group=pb.LaunchGroup(
            group_id=c.group_id, gpu_index=c.gpu_index, key=key_to_pb(c.key),
            compute_pct=c.demand.compute_pct, memory_mib=c.demand.memory_mib,
            cores=c.demand.cores, members=[launch_pb(m) for m in c.members]))
    if isinstance(c, KillTrial):
        return pb.ServerMessage(kill=pb.KillTrial(trial_id=c.trial_id, reason=c.reason,
                                                  attempt=c.attempt))
    if isinstance(c, DropCheckpoint):
        return pb.ServerMessage(drop_checkpoint=pb.DropCheckpoint(
            trial_id=c.trial_id, study_id=c.study_id))
    assert isinstance(c, ProfileWorkload) and c.program is not None
    # Profiled with the trial the core chose (a fused width: a trial of the workload
    # alone, which the agent runs K times).
    return pb.ServerMessage(profile=pb.ProfileWorkload(
        key=key_to_pb(c.key), arch=c.arch, gpu_index=c.gpu_index, iterations=c.iterations,
        warmup=c.warmup, program=program_to_pb(c.program),
        params_json=json.dumps(c.params, sort_keys=True), epochs=c.epochs,
        owner=c.owner, sample=c.sample))


class Intake:
    """The agents' messages between their streams and the event worker."""

    def __init__(self, gather_s: float = 0.0) -> None:
        # SimpleQueue: its put and get are C calls without the Python-level condition a
        # queue.Queue takes (a thousand nodes put and get tens of thousands a minute).
        self._inbox: queue.SimpleQueue[Queued] = queue.SimpleQueue()
        # Heartbeats waiting for a batch, the latest per node, oldest first (next_batch).
        self._beats: dict[str, Queued] = {}
        # Under load, how long a batch waits after its first message for more (next_batch),
        # and when the last message taken arrived.
        self.gather_s = gather_s
        self._last_arrival = -math.inf

    def put(self, session: AgentSession, msg: pb.AgentMessage) -> None:
        """Queue one message from an agent. A heartbeat is acknowledged on receipt, batch
        or no batch, store or no store: the agent's fence lease runs from it."""
        if session.overflowed:
            return  # its stream is cut: what it still sends counts for nothing
        kind = msg.WhichOneof("body")
        if kind == "heartbeat" and msg.heartbeat.seq and session.connected:
            session.ack(heartbeat_ack(msg.heartbeat.seq))
        elif kind == "started":
            # Agents before 2026-11-28 sent one per launch; it says nothing the launch and
            # the heartbeats do not, so it is not queued (a message a trial saved).
            return
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
        # Under load (this message came within `gather_s` of the last one), the batch
        # waits until `gather_s` after it for the messages that follow: each batch costs
        # a commit, a decision and a wake-up of the agents' loop whatever its size, and
        # one message per batch was a fifth of the server's core at a thousand nodes.
        # An idle server applies a message at once.
        end = -math.inf
        if items and items[0][2] - self._last_arrival < self.gather_s:
            end = items[0][2] + self.gather_s
        while len(items) < 5000:
            try:
                left = end - time.monotonic()
                items.append(self._inbox.get(timeout=left) if left > 0
                             else self._inbox.get_nowait())
            except queue.Empty:
                break
        if items:
            self._last_arrival = max(self._last_arrival, items[-1][2])
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


    @staticmethod
    def acknowledge(items: list[Queued], woken: list[AgentSession]) -> None:
        """Tell each agent which of its reports the batch committed (applied, or stale or
        refused: sending them again would change nothing); it stops sending those. A batch
        the store undid acknowledges nothing, and the agent sends them again. Called
        before the batch's commands are queued, which then carry the acknowledgements;
        the sessions added to `woken` are to be woken after them (AgentSession.wake): not
        one whose acknowledgements wait for its next message (AgentSession.wants_wake).
        At a thousand nodes, with nothing pending, an exit's acknowledgement alone was
        one of every three messages the stream loop wrote."""
        sessions: dict[int, AgentSession] = {}
        for session, msg, _ in items:
            ack = ack_id(msg)
            if ack is not None and session.connected:
                session.ack(ack, wake=False)
                if session.wants_wake(ack):
                    sessions[id(session)] = session
        woken += sessions.values()

    @staticmethod
    def event_of(session: AgentSession, msg: pb.AgentMessage, now: float,
                 known_node: Callable[[str], bool], stats: dict[str, int]) -> Event | None:
        """The orchestrator's event for an agent's message (None: nothing to apply)."""
        kind = msg.WhichOneof("body")
        node = session.node
        session.last_seen = now
        if kind == "heartbeat":
            stats["heartbeats"] += 1
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
            running += session.on_the_way(processed, running)
            if not session.connected:
                return None
            if not known_node(node):
                # Declared lost (silent too long) but alive: it joins again.
                log.warning("node %s was lost but its agent is alive; it joins again", node)
                return NodeJoined(session.spec, running)
            return Heartbeat(node, running)
        if kind == "metrics":
            return progress_event(node, msg.metrics)
        if kind == "exited":
            return exit_event(node, msg.exited)
        if kind == "profile":
            return profile_event(node, msg.profile)
        if kind == "register":
            raise InvalidInput("register: already registered on this stream")
        raise InvalidInput("empty agent message")
