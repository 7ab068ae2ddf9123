"""What the agent's loop does between the server's messages: poll what runs and report
what ended (`_poll`: exits, kills, profile runs and fused groups, metrics at most every
METRICS_EVERY_S, logs kept to their cap, the processes ended trials left behind), fence
its trials when the server's lease lapsed, and check the MPS daemons and the devices'
use. A mixin of `agent.Agent`, which holds the state named below; split out of agent.py,
which keeps the stream, the heartbeats and the server's commands.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.agent.fields import AgentFields
from hypersack.agent.groups import MemberJob
from hypersack.agent.launcher import Job
from hypersack.agent.ledger import Unacked
from hypersack.agent.procs import kill_strays
from hypersack.agent.profile_runs import profile_message
from hypersack.agent.reports import fenced_by_keeper, metrics_message
from hypersack.agent.warm import WARM_MARK
from hypersack.core import trial_env as sdk
from hypersack.wire.convert import LOG_TAIL_CHARS

log = logging.getLogger("hypersack.agent.agent")

METRICS_EVERY_S = 0.5  # at most this often, a trial's metrics go to the server
OBSERVE_INTERVAL_S = 1.0  # how often running trials' device use is sampled
LOG_CHECK_INTERVAL_S = 1.0  # how often trial logs are checked against their cap
MPS_CHECK_INTERVAL_S = 5.0  # how often the MPS daemons are asked whether they live
SWEEP_INTERVAL_S = 1.0  # at most this often, after a trial ended: kill what it left


class ProcessPolling(AgentFields):
    """The agent's polling of its processes (see the module)."""

    # More of the agent's state these read and change (set in Agent.__init__).
    fence_s: float
    connected: threading.Event
    resend_s: float
    _unacked: Unacked
    _mps_checked_at: float
    _observed_at: float
    _logs_checked_at: float
    _swept_at: float
    _ended_since_sweep: bool

    if TYPE_CHECKING:
        def _send_unacked(self, outbox: queue.Queue[pb.AgentMessage | None], older_s: float
                          ) -> None: ...

        def _observe(self) -> None: ...

        def _running_ids(self) -> set[str]: ...

    def _fence_if_lapsed(self) -> None:
        """Stop every trial if the lease lapsed (the keeper does it too, and a frozen
        agent that wakes must not report a trial as running that the server may have
        started elsewhere): before anything is reported."""
        if not self.lease.lapsed():
            return
        with self.jobs_lock:
            every = [*self.jobs.values(), *self.groups.values()]
        victims = [j for j in every if not j.profile and j.exit_code is None
                   and not j.fenced and j.killed_at is None]
        if not victims:
            return
        log.warning("fence: no word from the server for %.1f s (fence %g s): %d trial(s) "
                    "stopped (by the keeper already, unless it failed), to run "
                    "again once the server reschedules them",
                    self.fence_s - self.lease.left_s(), self.fence_s, len(victims))
        for job in victims:
            job.fenced = True
            job.kill()

    def _poll(self, outbox: queue.Queue[pb.AgentMessage | None]) -> None:
        self._fence_if_lapsed()
        self.keep_fence()
        if self._unacked and self.connected.is_set():
            self._send_unacked(outbox, self.resend_s)
        if self.mps is not None and \
                time.monotonic() - self._mps_checked_at >= MPS_CHECK_INTERVAL_S:
            self._mps_checked_at = time.monotonic()
            self.mps.check()
        if time.monotonic() - self._observed_at >= OBSERVE_INTERVAL_S:
            self._observed_at = time.monotonic()
            self._observe()
        if time.monotonic() - self._logs_checked_at >= LOG_CHECK_INTERVAL_S:
            self._logs_checked_at = time.monotonic()
            for job in list(self.jobs.values()):
                job.cap_log()
        for key in list(self.groups):
            group = self.groups[key]
            if group.poll() is not None and not any(
                    isinstance(j, MemberJob) and j.group is group for j in self.jobs.values()):
                with self.jobs_lock:
                    del self.groups[key]
                self.records.remove(group.key)
                self._ended_since_sweep = True
        for job_id in list(self.jobs):
            job = self.jobs[job_id]
            if job.held:
                continue  # no process, no files yet (LaunchCommands._start_held)
            if not job.profile and job.killed_at is None and (job.new_metrics()
                                                               or job.metrics_due):
                # At most every METRICS_EVERY_S a trial: what it writes faster waits.
                now = time.monotonic()
                job.metrics_due = now - job.metrics_sent_at < METRICS_EVERY_S
                if not job.metrics_due:
                    job.metrics_sent_at = now
                    outbox.put(metrics_message(job))
            code = job.poll()
            if code is None:
                continue
            with self.jobs_lock:
                del self.jobs[job_id]
            if not isinstance(job, MemberJob):
                self.records.remove(job.key)
            self._ended_since_sweep = True
            fenced = job.fenced or fenced_by_keeper(job, self.fenced_dir)
            if job.profile:
                if job.killed_at is None or fenced:
                    self._send(outbox, self._profile_result(job, code), job.gpu_index)
                continue
            if job.killed_at is not None and not fenced:
                # The server stopped it (pruned, cancelled, preempted): only its log goes
                # back, so that `hypersack logs` shows what it printed.
                job.cap_log()
                self._send(outbox, pb.AgentMessage(exited=pb.TrialExited(
                    trial_id=job.id, exit_code=code, log_tail=job.exit_tail(LOG_TAIL_CHARS),
                    attempt=job.attempt, killed=True)), job.gpu_index)
                continue
            job.last_metrics()
            job.cap_log()
            if job.unsent:  # the last steps of its curve, before its exit
                outbox.put(metrics_message(job))
            log.info("%s exited with code %d%s", job.id, code,
                     " (fenced)" if fenced else "")
            self._send(outbox, pb.AgentMessage(exited=pb.TrialExited(
                trial_id=job.id, exit_code=code, log_tail=job.exit_tail(LOG_TAIL_CHARS),
                metrics=job.metrics, out_of_memory=code == sdk.OOM_EXIT_CODE and not fenced,
                peak_memory_mib=job.peak_memory_mib, attempt=job.attempt, fenced=fenced)),
                job.gpu_index)
        if self.checkpoints.dropped:
            self.checkpoints.delete_dropped(self._running_ids())
        if self._ended_since_sweep and time.monotonic() - self._swept_at >= SWEEP_INTERVAL_S:
            # Processes that trials which ended left behind (their marker names a job no
            # longer running) go now: a trial's tree never outlives it.
            self._swept_at = time.monotonic()
            self._ended_since_sweep = False
            try:
                kill_strays(self.agent_dir, set(self.jobs) | set(self.groups) | {WARM_MARK})
            except Exception as exc:  # a scan that fails must not stop the agent
                log.warning("looking for processes left by trials failed: %s", exc)

    def _profile_result(self, job: Job, code: int) -> pb.AgentMessage:
        m = self._profile_keys.pop(job.id)
        device = next(d for d in self.backend.devices() if d.index == job.gpu_index)
        return profile_message(m, job, code, device, self.backend, self.node)
