"""The agent loop: dial the server, register, then heartbeat, run commands, report exits.

It keeps its trials running while the server is away and reconnects with backoff;
on reconnecting it reports what still runs (the server adopts it) and re-sends the
exits it reported just before the stream broke, so no result is lost. The server's
launch and profile commands are `commands.LaunchCommands`'; the polling of what runs and
the fence, `polling.ProcessPolling`'s; what the stream sends and hears acknowledged,
`acks.StreamReports`'.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import grpc

from hypersack import __version__
from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc
from hypersack.agent.accounts import TrialUsers
from hypersack.agent.acks import MAX_ACKS, StreamReports, unbatched
from hypersack.agent.checkpoints import Checkpoints
from hypersack.agent.commands import LaunchCommands
from hypersack.agent.devices import DeviceBackend, DeviceState
from hypersack.agent.fence import (
    FENCED_MARK,
    KEEPER_FILE,
    Lease,
    fence_of,
    keeper_argv,
    kill_grace_of,
    record_keeper,
    stop_keeper,
)
from hypersack.agent.guard import CommandPolicy, clean_env
from hypersack.agent.launcher import (
    KILL_GRACE_S,
    LOG_MAX_BYTES,
    Job,
    node_dir,
)
from hypersack.agent.ledger import Beats, Unacked
from hypersack.agent.mps import TIME_SLICING, MpsControl
from hypersack.agent.polling import ProcessPolling
from hypersack.agent.procs import Records, children_map, kill_strays
from hypersack.agent.warm import WarmPool
from hypersack.core.bounds import clamp
from hypersack.core.errors import HyperSackError, InvalidInput

log = logging.getLogger(__name__)

# How long the launches of a kind wait for its warm process to finish importing before
# starting cold: bounded, so a preload that hangs (a module that blocks at import) costs
# those trials this much once. They wait held (Job.held), never blocking the agent.
WARM_WAIT_S = 10.0

# Keepalive pings find a dead link (a silent peer, a dropped NAT entry) in seconds.
CHANNEL_OPTIONS = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
                   ("grpc.keepalive_permit_without_calls", 1),
                   ("grpc.http2.max_pings_without_data", 0)]
FATAL = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED,
         grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


class AgentError(HyperSackError):
    """The server refused this agent for good (bad inventory, or a name in use too long)."""


class _Ended:
    def __init__(self, error: grpc.RpcError | None) -> None:
        self.error = error


class _Exited:
    """A warm trial ended, or a warm process got ready or died: poll (and start the
    launches held for it) now rather than at the next interval."""


class Agent(LaunchCommands, ProcessPolling, StreamReports):
    def __init__(self, server: str, node: str, backend: DeviceBackend, workdir: Path, *,
                 poll_interval_s: float = 0.2, reconnect_max_s: float = 10.0,
                 duplicate_timeout_s: float = 60.0, kill_on_stop: bool = True,
                 log_max_bytes: int = LOG_MAX_BYTES, commands: CommandPolicy | None = None,
                 pass_env: Iterable[str] = (), inherit_env: bool = False,
                 credentials: grpc.ChannelCredentials | None = None,
                 server_name: str | None = None, users: TrialUsers | None = None,
                 mps: MpsControl | None = None, checkpoints: Path | None = None,
                 owner: str = "", warm_start: bool = True) -> None:
        self.server = server
        # TLS to the server, with this node's certificate (None: plain, loopback only).
        self.credentials = credentials
        self.channel_options: list[tuple[str, str | int]] = list(CHANNEL_OPTIONS)
        if server_name:
            self.channel_options.append(("grpc.ssl_target_name_override", server_name))
        self.node = node
        self.backend = backend
        # Absolute: trials run in folders of their own (their cwd), and the paths the
        # agent hands them (a fused group's members' metrics files) must hold there.
        self.workdir = workdir = Path(workdir).resolve()
        self.poll_interval_s = poll_interval_s
        self.reconnect_max_s = reconnect_max_s
        self.duplicate_timeout_s = duplicate_timeout_s
        self.kill_on_stop = kill_on_stop
        self.log_max_bytes = log_max_bytes
        self.commands = commands or CommandPolicy()
        self.users = users or TrialUsers()  # default: trials run as the agent's user
        self.owner = owner  # the one study owner whose trials it runs ("": anyone's)
        self.mps = mps  # None: co-located trials time-slice
        self._mps_checked_at = 0.0
        # What trials see of this process's environment (`inherit_env`: all of it, for
        # `hypersack run` on one's own machine).
        self.base_env = None if inherit_env else clean_env(os.environ, pass_env)
        self.jobs: dict[str, Job] = {}  # by Job.key: trial#attempt, or a profile's id
        self.groups: dict[str, Job] = {}  # fused groups' processes; members are in jobs
        self.jobs_lock = threading.Lock()  # the heartbeat thread reads jobs
        # Trial directories are private to the agent's user.
        self.node_dir = node_dir(workdir, node)
        self.node_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.agent_dir = str(self.node_dir.resolve())
        self.records = Records(self.node_dir / "jobs")
        # Trials forked from warm processes that imported their libraries once (see
        # hypersack.agent.warm); `warm_start` false: every trial starts cold.
        self.warm = WarmPool(self.node_dir / "warm", self.agent_dir, self.base_env,
                             enabled=warm_start, wait_s=WARM_WAIT_S)
        # Trials' checkpoint folders: under this node's directory, or under a folder
        # every node sees (a shared file system), where a trial resumes on any node.
        root = self.node_dir.resolve()
        if checkpoints is not None:
            try:
                checkpoints.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InvalidInput(f"--checkpoint-dir {checkpoints}: not a folder this agent "
                                   f"can use ({exc.strerror or exc})") from None
            root = checkpoints.resolve()
        self.checkpoints = Checkpoints(root)
        self._swept_at = 0.0
        self._ended_since_sweep = False
        self.heartbeat_timeout_s = 30.0
        self._profile_keys: dict[str, pb.ProfileWorkload] = {}
        self._stop = threading.Event()
        # Exit and profile reports the server has not yet acknowledged as committed:
        # sent again at each (re)connection and every `resend_s` until it does.
        self._unacked = Unacked(self.jobs_lock)
        self.resend_s = 2.0
        # The fence (see hypersack.agent.fence): the lease the keeper reads,
        # renewed by each heartbeat the server acknowledges; the heartbeats' send times.
        self.lease = Lease(self.node_dir / "lease")
        self.lease.path.write_text("0")  # nothing may run before the server is heard
        self.fence_s = fence_of(self.heartbeat_timeout_s)
        # Where the keeper marks the jobs it stopped (agent-owned: a trial cannot forge
        # its own mark), and the keeper itself (started by `run`).
        self.fenced_dir = self.node_dir / FENCED_MARK
        self.fenced_dir.mkdir(mode=0o700, exist_ok=True)
        for old in self.fenced_dir.iterdir():  # an earlier agent's: of processes gone
            old.unlink(missing_ok=True)
        self.keeper: subprocess.Popen[bytes] | None = None
        self._beats = Beats()
        self._processed = 0
        self.connected = threading.Event()
        self.sessions = 0
        self.heartbeat_interval_s = 5.0
        self._observed_at = 0.0
        # For /metrics: the devices as the latest heartbeat sampled them, and when it went.
        self.device_states: list[DeviceState] = []
        self.heartbeat_sent_at: float | None = None
        self._logs_checked_at = 0.0

    # ----------------------------------------------------------------- lifecycle
    def reap_leftovers(self) -> int:
        """Kill what an earlier agent of this node and work directory left running (it
        died without reporting, and the server runs those trials again elsewhere)."""
        found = self.records.kill_leftovers()
        found += kill_strays(self.agent_dir, set(), everywhere=True)
        stop_keeper(self.node_dir / KEEPER_FILE)  # it guarded what was just killed
        if found:
            log.warning("killed %d process(es) left by a previous agent of %s", found,
                        self.node)
        return found

    def _backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2^attempt)], the cap below half the
        heartbeat timeout the server announced, so a reconnect beats the timeout."""
        cap = min(self.reconnect_max_s, max(0.2, self.heartbeat_timeout_s / 2 - 0.5))
        return random.uniform(0.0, min(cap, 0.2 * 2 ** min(attempt, 16)))

    def run(self) -> None:
        """Serve until stop(); raises AgentError if the server refuses this agent."""
        failures = 0
        refused_since: float | None = None
        self.reap_leftovers()
        if self.mps is not None:
            self.mps.start()
        try:
            while not self._stop.is_set():
                error, was_connected = self._session()
                if was_connected:
                    failures = 0  # a good session resets the backoff
                delay = self._backoff(failures)
                failures += 1
                if self._stop.is_set():
                    break
                if error is not None:
                    code = error.code()
                    detail = error.details() or str(code)
                    if code in FATAL:
                        raise AgentError(f"the server refused node {self.node!r}: {detail}")
                    if code == grpc.StatusCode.ALREADY_EXISTS:
                        refused_since = refused_since or time.monotonic()
                        if time.monotonic() - refused_since > self.duplicate_timeout_s:
                            raise AgentError(f"the server refused node {self.node!r}: {detail}")
                    log.warning("server %s: %s; reconnecting in %.1f s", self.server, detail,
                                delay)
                else:
                    refused_since = None
                    log.warning("server %s closed the stream; reconnecting in %.1f s",
                                self.server, delay)
                if self._stop.wait(delay):
                    break
        finally:
            if self.kill_on_stop:
                self._kill_all()
                self._stop_keeper()  # nothing of ours is left to fence
            if self.mps is not None:
                self.mps.stop()  # after its clients ended

    def stop(self) -> None:
        self._stop.set()

    def keep_fence(self) -> None:
        """Start the keeper (see agent.fence) if none runs while the lease holds: before
        any process starts, and at every poll. (It ends by itself once the lease lapsed
        and nothing of ours is left to stop, and nothing starts while it has lapsed.)"""
        if (self.keeper is not None and self.keeper.poll() is None) or self.lease.lapsed():
            return
        if self.keeper is not None and self.keeper.returncode:
            log.warning("the fence's keeper failed (exit %s); starting another",
                        self.keeper.returncode)
        try:
            self.keeper = subprocess.Popen(
                keeper_argv(self.lease.path, self.agent_dir, self.fenced_dir),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        except OSError as exc:  # the agent's own fence still holds while it runs
            log.warning("no fence keeper: %s", exc)
            self.keeper = None
            return
        # For a later agent of this directory, which stops it (see reap_leftovers).
        record_keeper(self.node_dir / KEEPER_FILE, self.keeper.pid)

    def _stop_keeper(self) -> None:
        if self.keeper is not None and self.keeper.poll() is None:
            self.keeper.terminate()
            try:
                self.keeper.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.keeper.kill()

    def _kill_all(self) -> None:
        every = [*self.groups.values(), *self.jobs.values()]
        for job in every:
            job.kill()
        deadline = time.monotonic() + 10
        while any(j.poll() is None for j in every) and time.monotonic() < deadline:
            time.sleep(0.05)
        for job in every:
            self.records.remove(job.key)
        self.warm.close()  # its trials have ended
        kill_strays(self.agent_dir, set())

    # ----------------------------------------------------------------- one stream
    def _running(self) -> list[pb.RunningTrial]:
        """The trials this node runs, and those whose exit the server has yet to
        acknowledge: to the server they still hold their place (it neither requeues them
        nor may start them elsewhere) until their exit is committed."""
        with self.jobs_lock:
            jobs = list(self.jobs.values())
            exited = self._unacked.exits()
        return [pb.RunningTrial(trial_id=j.id, gpu_index=j.gpu_index,
                                peak_memory_mib=j.peak_memory_mib,
                                peak_utilization_pct=j.peak_util_pct, attempt=j.attempt)
                for j in jobs if not j.profile and j.exit_code is None] + [
            pb.RunningTrial(trial_id=e.trial_id, gpu_index=gpu, attempt=e.attempt)
            for e, gpu in exited]

    def _observe(self) -> None:
        """Sample each running trial's device use; the peaks go out with heartbeats and
        exits, and the server corrects profiles that they exceed."""
        if not self.backend.observes:
            return  # nothing to learn: no process scan either
        devices = {d.index: d for d in self.backend.devices()}
        children = children_map()  # one scan of /proc for every trial's tree
        jobs = {j.key: (devices[j.gpu_index], j.pids(children)) for j in self.jobs.values()
                if not j.profile and j.exit_code is None and j.gpu_index in devices}
        try:
            usage = self.backend.observe({k: v for k, v in jobs.items() if v[1]})
        except Exception as exc:  # a failed read must not stop the agent
            log.warning("observing trials failed: %s", exc)
            return
        for job_id, u in usage.items():
            job = self.jobs[job_id]
            job.memory_mib, job.util_pct = u.memory_mib, u.utilization_pct
            job.peak_memory_mib = max(job.peak_memory_mib, u.memory_mib)
            job.peak_util_pct = max(job.peak_util_pct, u.utilization_pct)

    def _register(self) -> pb.AgentMessage:
        self._fence_if_lapsed()
        running = self._running()
        return pb.AgentMessage(register=pb.Register(
            node=self.node, cores=self.backend.cores(), backend=self.backend.name,
            version=__version__, running=running, owner=self.owner, folded_acks=True,
            held_acks=True, batched=True,
            gpus=[pb.GpuInfo(index=d.index, arch=d.arch, memory_mib=d.memory_mib, uuid=d.uuid)
                  for d in self.backend.devices()]))

    def _session(self) -> tuple[grpc.RpcError | None, bool]:
        """One stream: (the error that ended it, whether it registered)."""
        outbox: queue.Queue[pb.AgentMessage | None] = queue.Queue()
        inbox: queue.Queue[pb.ServerMessage | _Ended | _Exited] = queue.Queue()
        self.warm.on_exit = lambda: inbox.put(_Exited())
        self._processed = 0  # the server's messages handled on this stream
        outbox.put(self._register())
        self._send_unacked(outbox, 0.0)  # all of them, after the registration
        channel = (grpc.insecure_channel(self.server, options=self.channel_options)
                   if self.credentials is None else
                   grpc.secure_channel(self.server, self.credentials,
                                       options=self.channel_options))
        stub = pb_grpc.AgentLinkStub(channel)  # type: ignore[no-untyped-call]
        call = stub.Connect(self._sized(outbox))

        def read() -> None:
            error: grpc.RpcError | None = None
            try:
                for batch in call:
                    for msg in unbatched(batch):
                        try:
                            self._heard(msg)
                        except Exception as exc:  # the lease not renewed: the fence holds
                            log.warning("could not renew the fence lease: %s", exc)
                        inbox.put(msg)
            except grpc.RpcError as exc:
                error = exc
            inbox.put(_Ended(error))

        reader = threading.Thread(target=read, daemon=True, name="agent-reader")
        reader.start()
        done = threading.Event()

        def beat() -> None:
            """Heartbeats on their own timer: launches and scans never delay them."""
            while not done.is_set() and not self._stop.is_set():
                if self.connected.is_set():
                    outbox.put(self._heartbeat())
                    done.wait(self.heartbeat_interval_s)
                else:
                    done.wait(0.05)

        beater = threading.Thread(target=beat, daemon=True, name="agent-heartbeat")
        beater.start()
        ended: _Ended | None = None
        was_connected = False
        try:
            while not self._stop.is_set():
                try:
                    item = inbox.get(timeout=self.poll_interval_s)
                except queue.Empty:
                    item = None
                while item is not None:
                    if isinstance(item, _Ended):
                        ended = item
                        break
                    if not isinstance(item, _Exited):
                        self._command(item, outbox)
                    try:
                        item = inbox.get_nowait()
                    except queue.Empty:
                        item = None
                if ended is not None:
                    break
                was_connected = was_connected or self.connected.is_set()
                self._start_held(outbox)
                self._poll(outbox)
        finally:
            done.set()
            self.connected.clear()
            outbox.put(None)
            call.cancel()
            channel.close()
        return (ended.error if ended is not None else None), was_connected

    def _heartbeat(self) -> pb.AgentMessage:
        self._fence_if_lapsed()
        processed = self._processed  # read first: every launch it counts is in the list
        running = self._running()
        try:
            states = self.backend.sample()
        except Exception as exc:  # a device read failing must not stop heartbeats
            log.warning("device sample failed: %s", exc)
            states = []
        self.device_states = states
        self.heartbeat_sent_at = time.monotonic()
        seq = self._beats.sent(self.heartbeat_sent_at)
        return pb.AgentMessage(heartbeat=pb.Heartbeat(
            seq=seq, running=running, processed=processed,
            gpus=[self._gpu_state(s) for s in states]))

    def _gpu_state(self, s: DeviceState) -> pb.GpuState:
        sharing, restarts = self.mps.mode(s.index) if self.mps is not None \
            else (TIME_SLICING, 0)
        return pb.GpuState(index=s.index, utilization_pct=s.utilization_pct,
                           memory_used_mib=s.memory_used_mib, sharing=sharing,
                           mps_restarts=restarts)

    # ----------------------------------------------------------------- commands
    def _command(self, msg: pb.ServerMessage, outbox: queue.Queue[pb.AgentMessage | None]
                 ) -> None:
        """Handle one of the server's messages: the acknowledgements it carries, then its
        command, which counts as handled (Heartbeat.processed) once done (a launch, once
        in self.jobs). Acknowledgements alone are not one of the messages counted."""
        for ack in msg.acks[:MAX_ACKS]:
            self._acked(ack)
        if msg.WhichOneof("body") is not None:
            self._do(msg, outbox)
            self._processed += 1

    def _do(self, msg: pb.ServerMessage, outbox: queue.Queue[pb.AgentMessage | None]
            ) -> None:
        kind = msg.WhichOneof("body")
        if kind == "registered":
            r = msg.registered
            self.heartbeat_interval_s = clamp(r.heartbeat_interval_s, 0.05, 3600.0, 5.0)
            self.heartbeat_timeout_s = clamp(r.heartbeat_timeout_s or 30.0, 0.5, 1e6, 30.0)
            self.sessions += 1
            self.fence_s = fence_of(self.heartbeat_timeout_s)
            self.lease.grace_s = kill_grace_of(self.heartbeat_timeout_s, KILL_GRACE_S)
            if self.heartbeat_interval_s >= self.fence_s:
                log.warning("heartbeats every %g s, fence %g s: trials would be fenced "
                            "between heartbeats; the server's heartbeat timeout should be "
                            "several heartbeat intervals", self.heartbeat_interval_s,
                            self.fence_s)
            self.lease.renew(time.monotonic() + self.fence_s)  # it just heard us
            self.connected.set()
            log.info("registered with %s as %s (%d devices)", self.server, self.node,
                     len(self.backend.devices()))
        elif kind == "launch":
            self._launch(msg.launch, outbox)
        elif kind == "launch_group":
            self._launch_group(msg.launch_group, outbox)
        elif kind == "kill":
            k = msg.kill
            for job in self._attempts(k.trial_id, [k.attempt] if k.attempt else None):
                if job.exit_code is None:  # one that ended waits for its exit's ack only
                    log.info("killing %s (attempt %d): %s", job.id, job.attempt, k.reason)
                    job.kill()
        elif kind == "profile":
            self._profile(msg.profile, outbox)
        elif kind == "acked":
            self._acked(msg.acked.id)
        elif kind == "drop_checkpoint":
            d = msg.drop_checkpoint
            self.checkpoints.drop(d.study_id, d.trial_id)
            self.checkpoints.delete_dropped(self._running_ids())
