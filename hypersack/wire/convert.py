"""Translation between domain types and protocol messages, shared by server, agent, CLI."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.core.bounds import MAX_COMPUTE_PCT, MAX_GPUS_PER_NODE, MAX_MEMORY_MIB, clamp
from hypersack.core.errors import InvalidInput
from hypersack.core.types import (
    GpuSpec,
    HistoryStep,
    NodeSpec,
    Profile,
    Span,
    StudyRecord,
    TrialRecord,
    WorkloadKey,
    parse_key_params,
)
from hypersack.grid.settings import Objective
from hypersack.grid.space import Program
from hypersack.sampler.profiles import COLUMNS, KEY_COLUMNS, profile_from_row, profile_to_row

T = TypeVar("T")

MAX_METRICS = 64
MAX_METRIC_NAME = 64
LOG_TAIL_CHARS = 4000


HEARTBEAT_ACK = "heartbeat:"  # how the server acknowledges heartbeat N: "heartbeat:N"


def heartbeat_ack(seq: int) -> str:
    """The acknowledgement of the agent's heartbeat numbered `seq`."""
    return f"{HEARTBEAT_ACK}{seq}"


def ack_id(msg: pb.AgentMessage) -> str | None:
    """The name under which the server acknowledges an agent's report, and the agent keeps
    it until then: an exit by trial and attempt, a profile result by workload and
    architecture. None: a message that is not acknowledged (heartbeats, metrics)."""
    kind = msg.WhichOneof("body")
    if kind == "exited":
        return f"exit:{msg.exited.attempt}:{msg.exited.trial_id}"
    if kind == "profile":
        key = msg.profile.key.SerializeToString(deterministic=True).hex()
        return f"profile:{key}:{msg.profile.arch}"
    return None


def key_to_pb(key: WorkloadKey) -> pb.WorkloadKey:
    return pb.WorkloadKey(model=key.model, batch_size=key.batch_size, optimizer=key.optimizer,
                          precision=key.precision, fusion_width=key.fusion_width,
                          params=key.params_text())


def key_from_pb(msg: pb.WorkloadKey) -> WorkloadKey:
    """Raises ValueError (pydantic's included) for a malformed key."""
    if len(msg.params) > 2048:
        raise ValueError("workload key params: too long")
    return WorkloadKey(model=msg.model, batch_size=msg.batch_size, optimizer=msg.optimizer or "sgd",
                       precision=msg.precision or "fp32", fusion_width=msg.fusion_width or 1,
                       params=parse_key_params(msg.params))


_RECORD_COLUMNS = tuple(c for c in COLUMNS if c not in KEY_COLUMNS)


def profile_to_pb(p: Profile) -> pb.ProfileRecord:
    row = profile_to_row(p)
    return pb.ProfileRecord(key=key_to_pb(p.key), **{c: row[c] for c in _RECORD_COLUMNS})


def profile_from_pb(msg: pb.ProfileRecord, *, where: str, default_source: str = "") -> Profile:
    """A profile record as a profile file's row; raises InvalidInput if malformed."""
    k = msg.key
    row = {"model": k.model, "batch_size": k.batch_size, "optimizer": k.optimizer,
           "precision": k.precision, "fusion_width": k.fusion_width or None,
           "params": k.params[:2048] or None,
           **{c: getattr(msg, c) for c in _RECORD_COLUMNS}}
    row["source"] = msg.source or default_source
    return profile_from_row(row, where=where)


def program_to_pb(program: Program) -> pb.Program:
    return pb.Program(builtin=program.builtin or "", command=program.command or "",
                      options_json=json.dumps(program.options), preload=program.preload)


def program_from_pb(msg: pb.Program) -> Program:
    return Program.model_validate({"builtin": msg.builtin or None,
                                   "command": msg.command or None,
                                   "options": json.loads(msg.options_json or "{}"),
                                   "preload": list(msg.preload)})


def node_from_register(msg: pb.Register) -> NodeSpec:
    """Raises InvalidInput (too many GPUs) or pydantic's ValidationError (turned into
    InvalidInput by the caller)."""
    if len(msg.gpus) > MAX_GPUS_PER_NODE:
        raise InvalidInput(f"register: {len(msg.gpus)} GPUs; at most {MAX_GPUS_PER_NODE} "
                           "per node")
    return NodeSpec(name=msg.node, cores=msg.cores, owner=msg.owner,
                    gpus=tuple(GpuSpec(index=g.index, arch=g.arch, memory_mib=g.memory_mib,
                                       uuid=g.uuid) for g in msg.gpus))


def clean_percent(value: float) -> float:
    """An observed utilization: finite, within bounds; NaN and infinities become 0 (an
    observation not made)."""
    return clamp(value, 0.0, MAX_COMPUTE_PCT, 0.0)


def clean_memory(value: int) -> int:
    """An observed memory peak in MiB, within bounds (negative: not measured)."""
    return int(min(max(0, value), MAX_MEMORY_MIB))


def clean_running(entries: Iterable[pb.RunningTrial], make: Callable[..., T]) -> tuple[T, ...]:
    """A heartbeat's running trials, each made by `make(trial_id, gpu_index, peak MiB,
    peak %, attempt)` with its peaks cleaned as clean_memory and clean_percent clean
    them. A thousand nodes list tens of thousands a second: a value already in bounds
    (every one, from a sound agent) is taken as it is, without the calls."""
    return tuple([make(r.trial_id, r.gpu_index,
                       m if 0 <= (m := r.peak_memory_mib) <= MAX_MEMORY_MIB
                       else clean_memory(m),
                       u if 0.0 <= (u := r.peak_utilization_pct) <= MAX_COMPUTE_PCT
                       else clean_percent(u), r.attempt)
                  for r in entries])


def clean_metrics(values: Any) -> dict[str, float]:
    """At most MAX_METRICS metrics with short names; NaN and infinities dropped (they
    cannot be stored, and a diverged trial is told by the value it reported before)."""
    out: dict[str, float] = {}
    for name, value in sorted(dict(values).items())[:MAX_METRICS]:
        if len(name) <= MAX_METRIC_NAME and math.isfinite(value):
            out[str(name)] = float(value)
    return out


def nonfinite_names(values: Any) -> tuple[str, ...]:
    """The (short) names of the metrics reported as NaN or infinite: a diverged trial."""
    return tuple(str(name) for name, value in sorted(dict(values).items())[:MAX_METRICS]
                 if len(name) <= MAX_METRIC_NAME and not math.isfinite(value))


def study_to_pb(study: StudyRecord, counts: dict[str, int], goals: Sequence[Objective],
                planned: int = 0) -> pb.Study:
    """`goals`: the study's objective, or its several (a multi-objective study)."""
    several = len(goals) > 1
    return pb.Study(id=study.id, name=study.name, state=study.state.value,
                    submitted_at=study.submitted_at, counts=counts,
                    space_json=json.dumps(study.space, sort_keys=True),
                    objective_metric=goals[0].metric, objective_mode=goals[0].mode,
                    objective_metrics=[o.metric for o in goals] if several else [],
                    objective_modes=[o.mode for o in goals] if several else [],
                    owner=study.owner, warnings=list(study.warnings),
                    planned=min(planned, 2**31 - 1))


def history_to_pb(steps: list[HistoryStep], spans: list[Span]) -> pb.History:
    return pb.History(
        steps=[pb.HistoryStep(trial_id=h.trial_id, step=h.step, at=h.at, metrics=h.metrics)
               for h in steps],
        spans=[pb.Span(trial_id=s.trial_id, attempt=s.attempt, node=s.node,
                       gpu_index=s.gpu_index, start=s.start, end=s.end, group=s.group)
               for s in spans])


def trial_to_pb(t: TrialRecord, last: HistoryStep | None = None, objective: str = ""
                ) -> pb.Trial:
    """A trial's message; with its curve's last step, the epoch it reached and the
    objective's value there (what a pruned or running trial shows)."""
    value = last.metrics.get(objective) if last is not None else None
    return pb.Trial(epoch=last.step if last is not None else 0,
                    has_last_value=value is not None, last_value=value or 0.0,
                    id=t.id, study_id=t.study_id, state=t.state.value,
                    params_json=json.dumps(t.params, sort_keys=True), workload=t.key.label(),
                    node=t.node or "", gpu_index=-1 if t.gpu_index is None else t.gpu_index,
                    failures=t.failures, launches=t.launches, metrics=t.metrics,
                    has_objective=t.objective is not None, objective=t.objective or 0.0,
                    reason=t.reason, log_tail=t.log_tail, started_at=t.started_at or 0.0,
                    finished_at=t.finished_at or 0.0, fused_group=t.group,
                    fusion_width=t.group_width)
