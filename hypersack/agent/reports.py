"""What the agent tells the server about a running job: its latest metrics, and
whether the fence's keeper stopped it."""

from __future__ import annotations

from pathlib import Path

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.agent.fence import fenced_mark
from hypersack.agent.groups import MemberJob
from hypersack.agent.launcher import Job


def fenced_by_keeper(job: Job, fenced: Path) -> bool:
    """Whether the keeper fenced the job (its group's process, for a fused member)."""
    process = job.group if isinstance(job, MemberJob) and job.group is not None else job
    if process.proc is None:
        return False
    mark = fenced_mark(fenced, process.proc.pid, process.proc_start)
    return mark is not None and mark.exists()


def metrics_message(job: Job) -> pb.AgentMessage:
    """A trial's latest metrics, with each step's own since the last message."""
    iter_s, window_s = job.take_timing()
    return pb.AgentMessage(metrics=pb.TrialMetrics(
        trial_id=job.id, step=job.step, metrics=job.metrics, attempt=job.attempt,
        steps=[pb.StepMetrics(step=k, metrics=v) for k, v in job.take_steps().items()],
        iter_time_s=iter_s, iter_window_s=window_s))
