"""What the agent does on the server's launch and profile commands: build a trial's,
fused group's or profile run's process (`_job`: its argument list, work directory and
environment, after the command guard and the node's owner), start it behind its fence
watchdog (`_guard`), and track it. A mixin of `agent.Agent`, which holds the state named
below; split out of agent.py, which keeps the stream, the heartbeats and the polling of
what runs.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import time
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.agent.accounts import TrialUsers
from hypersack.agent.fields import AgentFields
from hypersack.agent.groups import MemberJob, fused_argv, fused_spec
from hypersack.agent.guard import CommandPolicy
from hypersack.agent.launcher import (
    Job,
    argv_for,
    job_dir,
    job_key,
    preload_of,
    safe_part,
)
from hypersack.agent.profile_runs import as_fused_profile
from hypersack.agent.warm import WarmPool, WarmProcess
from hypersack.core import trial_env as sdk
from hypersack.core.bounds import MAX_FUSED_MEMBERS
from hypersack.core.errors import HyperSackError
from hypersack.core.types import GpuSpec
from hypersack.wire.convert import key_from_pb, program_from_pb

log = logging.getLogger("hypersack.agent.agent")


class LaunchCommands(AgentFields):
    """The agent's launch, launch_group and profile commands (see the module)."""

    # More of the agent's state these read and change (set in Agent.__init__).
    node_dir: Path
    owner: str
    users: TrialUsers
    base_env: dict[str, str] | None
    commands: CommandPolicy
    log_max_bytes: int
    warm: WarmPool
    heartbeat_timeout_s: float

    def _guard(self, job: Job) -> None:
        """Let the gated start run its program, unless the lease lapsed meanwhile (a
        frozen agent that woke): then it never runs, and ends fenced. The keeper (see
        agent.fence) fences it from its start, as every process marked as ours."""
        job.release(fenced=self.lease.lapsed())

    def _running_ids(self) -> set[str]:
        """The trials with an attempt still running on this node."""
        return {j.id for j in self.jobs.values() if j.exit_code is None}

    def _attempts(self, trial_id: str, attempts: Iterable[int] | None) -> list[Job]:
        """This node's jobs of a trial in those attempts (None: in any attempt)."""
        if attempts is None:
            return [j for j in self.jobs.values() if j.id == trial_id and not j.profile]
        found = (self.jobs.get(job_key(trial_id, a)) for a in attempts)
        return [j for j in found if j is not None]

    def _job(self, job_id: str, study_id: str, group: str, gpu_index: int,
             program: pb.Program, params_json: str, epochs: float,
             extra_env: dict[str, str] | None = None, profile: bool = False, attempt: int = 0,
             owner: str = "") -> tuple[Job, GpuSpec]:
        """A trial or profile process, not yet started: its argument list, work directory
        and environment. Raises HyperSackError or ValueError if it cannot run here."""
        self.keep_fence()  # in place before anything of ours runs
        device = next((d for d in self.backend.devices() if d.index == gpu_index), None)
        if device is None:
            raise HyperSackError(f"this node has no device {gpu_index}")
        workdir = job_dir(self.node_dir, group, job_id)
        if attempt:
            workdir = workdir / f"attempt-{attempt}"  # each attempt writes its own files
        if self.owner and owner != self.owner:
            raise HyperSackError(f"this agent runs the trials of {self.owner} only, not of "
                                 f"{owner or 'nobody'} (--owner)")
        account = self.users.account_for(owner)
        fields = {**json.loads(params_json or "{}"), "epochs": epochs, "trial_id": job_id,
                  "study_id": study_id, "workdir": str(workdir.resolve())}
        parsed = program_from_pb(program)
        argv = argv_for(parsed, fields)
        if program.command:  # decided on what runs: the filled argv, its executable resolved
            env_path = (os.environ if self.base_env is None else self.base_env).get("PATH")
            argv = self.commands.check(program.command, self.node, argv=argv,
                                       path=env_path or os.defpath) or argv
        env = {**self.backend.env_for(device), sdk.ENV_TRIAL_ID: job_id,
               sdk.ENV_STUDY_ID: study_id, sdk.ENV_PARAMS: params_json or "{}",
               sdk.ENV_EPOCHS: repr(epochs), sdk.ENV_OPTIONS: program.options_json or "{}",
               **({sdk.ENV_ATTEMPT: str(attempt)} if attempt else {}), **(extra_env or {})}
        return Job(job_id, gpu_index, workdir, argv, env, profile=profile, attempt=attempt,
                   agent_dir=self.agent_dir, log_max_bytes=self.log_max_bytes,
                   base_env=self.base_env, account=account, warm=self.warm,
                   preload=preload_of(parsed)), device

    def _launch(self, m: pb.LaunchTrial, outbox: queue.Queue[pb.AgentMessage | None]) -> None:
        same = self.jobs.get(job_key(m.trial_id, m.attempt))
        if same is not None and same.exit_code is None:
            return  # already running (a repeated command)
        for old in self._attempts(m.trial_id, range(1, m.attempt)):
            if old.exit_code is None:
                log.info("%s: attempt %d supersedes attempt %d", old.id, m.attempt, old.attempt)
                old.kill()
        try:
            mps_env = self.mps.client_env(m.gpu_index, m.compute_pct, m.memory_mib) \
                if self.mps is not None else {}
            job, _ = self._job(m.trial_id, m.study_id, m.study_id, m.gpu_index, m.program,
                               m.params_json, m.epochs, {**mps_env, **self.checkpoints.rung_env(m)},
                               attempt=m.attempt, owner=m.owner)
        except (HyperSackError, ValueError, OSError) as exc:
            self._cannot_launch(None, m.trial_id, m.attempt, m.gpu_index, exc, outbox)
            return
        job.hold_until = self.warm.ready_by(job.argv, job.account, job.preload)
        if job.hold_until is not None:
            # Its warm process is still importing: the launch waits for it in the
            # node's list (heartbeats show it, a kill ends it), while the agent goes on
            # with its other commands; `_start_held` starts it.
            with self.jobs_lock:
                self.jobs[job.key] = job
            log.info("%s (attempt %d) waits up to %.1f s for its warm process", m.trial_id,
                     m.attempt, job.hold_until - time.monotonic())
            return
        self._begin(job, outbox)

    def _start_held(self, outbox: queue.Queue[pb.AgentMessage | None]) -> None:
        """Start the launches held for their warm process: forked once it is ready,
        cold once it died or the wait ran out (see WarmPool.ready_by)."""
        now = time.monotonic()
        for job in [j for j in list(self.jobs.values()) if j.held]:
            assert job.hold_until is not None
            if now >= job.hold_until or \
                    self.warm.ready_by(job.argv, job.account, job.preload) is None:
                self._begin(job, outbox)

    def _begin(self, job: Job, outbox: queue.Queue[pb.AgentMessage | None]) -> None:
        """Start a launched trial's process, gated until its fence is in place, or a
        profile run's."""
        if job.profile:
            self._begin_profile(job, outbox)
            return
        try:
            job.start(gated=True)
        except (HyperSackError, ValueError, OSError) as exc:
            self._cannot_launch(job, job.id, job.attempt, job.gpu_index, exc, outbox)
            return
        # The gate (`_guard`: not with a lapsed lease), then the pid record; the keeper
        # fences the trial whatever the agent does meanwhile (SIGSTOP, a stalled disk
        # under the record's write).
        self._guard(job)
        if job.proc is not None:
            self.records.add(job.key, job.proc.pid, job.attempt)
        with self.jobs_lock:
            self.jobs[job.key] = job
        log.info("launched %s (attempt %d) on device %d%s: %s", job.id, job.attempt,
                 job.gpu_index, ", warm" if isinstance(job.proc, WarmProcess) else "",
                 " ".join(job.argv))

    def _begin_profile(self, job: Job, outbox: queue.Queue[pb.AgentMessage | None]) -> None:
        m = self._profile_keys[job.id]
        try:
            device = next((d for d in self.backend.devices() if d.index == job.gpu_index),
                          None)
            if device is None:
                raise HyperSackError(f"this node has no device {job.gpu_index}")
            job.start()
        except (HyperSackError, ValueError, OSError) as exc:
            self._cannot_profile(job, m, exc, outbox)
            return
        if job.proc is not None:
            self.backend.start_measuring(device, job.proc.pid)
            self.records.add(job.key, job.proc.pid, 0)
        with self.jobs_lock:
            self.jobs[job.id] = job
        log.info("profiling %s on device %d (%s)", job.id, job.gpu_index, m.arch)

    def _cannot_profile(self, job: Job | None, m: pb.ProfileWorkload, exc: Exception,
                        outbox: queue.Queue[pb.AgentMessage | None]) -> None:
        if job is not None:
            self._profile_keys.pop(job.id, None)
        self._unlist(job)
        self._send(outbox, pb.AgentMessage(profile=pb.ProfileResult(
            key=m.key, arch=m.arch, ok=False, error=f"cannot launch: {exc}",
            sample=m.sample)), m.gpu_index)

    def _unlist(self, job: Job | None) -> None:
        """A held job that could not start leaves the node's list (only that job: another
        of the same key, an exit not yet reported, stays)."""
        if job is not None:
            with self.jobs_lock:
                if self.jobs.get(job.key) is job:
                    del self.jobs[job.key]

    def _cannot_launch(self, job: Job | None, trial_id: str, attempt: int, gpu_index: int,
                       exc: Exception, outbox: queue.Queue[pb.AgentMessage | None]) -> None:
        """Its exit (127) goes to the server; `job`, if held, leaves the node's list."""
        self._unlist(job)
        self._send(outbox, pb.AgentMessage(exited=pb.TrialExited(
            trial_id=trial_id, exit_code=127, log_tail=f"cannot launch: {exc}",
            attempt=attempt)), gpu_index)

    def _launch_group(self, g: pb.LaunchGroup, outbox: queue.Queue[pb.AgentMessage | None]
                      ) -> None:
        """A fused group: one process (`hypersack.runner.fused_train`) for its members,
        each tracked, reported and killed as its own trial."""
        members = list(g.members)
        if all((j := self.jobs.get(job_key(m.trial_id, m.attempt))) is not None
               and j.exit_code is None for m in members):
            return  # already running (a repeated command)
        for m in members:
            for old in self._attempts(m.trial_id, range(1, m.attempt)):
                if old.exit_code is None:
                    old.kill()
        try:
            if not 1 <= len(members) <= MAX_FUSED_MEMBERS:
                raise HyperSackError(f"a fused group of {len(members)} members: 1 to "
                                     f"{MAX_FUSED_MEMBERS} expected")
            first = members[0]
            if first.program.builtin != "train" or any(
                    m.study_id != first.study_id or m.owner != first.owner
                    or m.params_json == "" for m in members):
                raise HyperSackError("a fused group trains the built-in trainer's models, "
                                     "one study's trials of one owner")
            key = key_from_pb(g.key)
            mps_env = self.mps.client_env(g.gpu_index, g.compute_pct, g.memory_mib) \
                if self.mps is not None else {}
            process, _ = self._job(safe_part(g.group_id), first.study_id, first.study_id,
                                   g.gpu_index, first.program, first.params_json,
                                   first.epochs, mps_env, owner=first.owner)
            process.argv = fused_argv()
            jobs: list[MemberJob] = []
            for m in members:
                base, _ = self._job(m.trial_id, m.study_id, m.study_id, g.gpu_index,
                                    m.program, m.params_json, m.epochs, attempt=m.attempt,
                                    owner=m.owner)
                jobs.append(MemberJob(**{f.name: getattr(base, f.name)
                                         for f in fields(Job) if f.init}, group=process))
            for j in jobs:
                j.siblings = jobs
            options = json.loads(first.program.options_json or "{}")
            process.env[sdk.ENV_FUSED] = json.dumps(fused_spec(
                key, first.epochs, options, [(j.id, json.loads(m.params_json or "{}"),
                                              j.metrics_path, j.stop_path)
                                             for j, m in zip(jobs, members, strict=True)],
                checkpoints=[self.checkpoints.attempt(m.study_id, m.trial_id, m.attempt)
                             for m in members],
                stop_at=sdk.epoch_count(first.stop_at_epoch)))
            for j in jobs:
                j.start()
            process.start(gated=True)
        except (HyperSackError, ValueError, OSError) as exc:
            for m in members:
                self._send(outbox, pb.AgentMessage(exited=pb.TrialExited(
                    trial_id=m.trial_id, exit_code=127, log_tail=f"cannot launch: {exc}",
                    attempt=m.attempt)), g.gpu_index)
            return
        self._guard(process)  # its fence first, as a trial's (_launch)
        if process.proc is not None:
            self.records.add(process.key, process.proc.pid, 0)
        with self.jobs_lock:
            self.groups[process.key] = process
            for j in jobs:
                self.jobs[j.key] = j
        log.info("launched fused group %s (%d members) on device %d", g.group_id, len(jobs),
                 g.gpu_index)

    def _profile(self, m: pb.ProfileWorkload, outbox: queue.Queue[pb.AgentMessage | None]
                 ) -> None:
        try:
            key = key_from_pb(m.key)
            job_id = f"profile-{key.label()}-{m.arch}"
            same = self.jobs.get(job_id)
            if same is not None and same.exit_code is None:
                return  # already running (the server asked again after a reconnection)
            # A profile run has its GPU to itself: an MPS client with all of it.
            mps_env = self.mps.client_env(m.gpu_index, 100.0, None) \
                if self.mps is not None else {}
            job, _ = self._job(
                job_id, "profile", "profiles", m.gpu_index, m.program, m.params_json, m.epochs,
                {sdk.ENV_PROFILE_ITERATIONS: str(m.iterations),
                 sdk.ENV_PROFILE_WARMUP: str(m.warmup), **mps_env}, profile=True,
                owner=m.owner)
            if key.fusion_width > 1:
                as_fused_profile(job, key, m)
        except (HyperSackError, ValueError, OSError) as exc:
            self._cannot_profile(None, m, exc, outbox)
            return
        self._profile_keys[job_id] = m
        job.hold_until = self.warm.ready_by(job.argv, job.account, job.preload)
        if job.hold_until is not None:  # held for its warm process, as a trial's launch
            with self.jobs_lock:
                self.jobs[job_id] = job
            return
        self._begin(job, outbox)
