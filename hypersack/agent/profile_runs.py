"""Profile runs on an agent: a fused width's run set up as one fused process of the
workload's trial K times over, and what a profile run measured, read into the server's
message (the SDK's result, the device's use over the timed iterations)."""

from __future__ import annotations

import json
import resource
import time

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.agent.devices import DeviceBackend, Measured, profile_window
from hypersack.agent.groups import fused_argv, fused_spec
from hypersack.agent.launcher import Job
from hypersack.core import trial_env as sdk
from hypersack.core.bounds import MAX_FUSED_MEMBERS
from hypersack.core.errors import HyperSackError
from hypersack.core.train_options import trial_seed
from hypersack.core.types import GpuSpec, WorkloadKey


def as_fused_profile(job: Job, key: WorkloadKey, m: pb.ProfileWorkload) -> None:
    """A fused width: the workload's trial K times over in one fused process, the
    members' seeds apart; the SDK times the group's iterations."""
    if m.program.builtin != "train" or key.fusion_width > MAX_FUSED_MEMBERS:
        raise HyperSackError(f"fused width {key.fusion_width} of a workload that "
                             f"is not the built-in trainer's, or too wide")
    params = json.loads(m.params_json or "{}")
    options = json.loads(m.program.options_json or "{}")
    seed = trial_seed(options.get("seed", 0), params)
    job.argv = fused_argv()
    job.env[sdk.ENV_FUSED] = json.dumps(fused_spec(
        key, m.epochs, options,
        [(f"member-{k}", {**params, "seed": seed + k}, job.workdir / f"member-{k}.jsonl", None)
         for k in range(key.fusion_width)]))


def profile_message(m: pb.ProfileWorkload, job: Job, code: int, device: GpuSpec,
                    backend: DeviceBackend, node: str) -> pb.AgentMessage:
    """The server's message for a profile run that ended with `code`: its profile, or
    why there is none."""
    result = job.profile_result()
    if code == 0 and result is None:
        # A program that marks no iterations (no SDK) ran to its end: the whole run
        # is its profile, one iteration per epoch (coarse, and never longer than
        # the trial).
        wall = max(0.001, time.monotonic() - job.started_at)
        # The largest resident size of any child this agent waited for: at least
        # this program's (an overestimate, the safe side for a demand).
        children_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        result = {"iter_time_s": wall / max(1.0, m.epochs), "iters_per_epoch": 1,
                  "iterations": 0, "cpu_cores": 1.0,
                  "peak_rss_mib": max(float(job.peak_memory_mib), children_mib)}
    if code != 0 or result is None:
        if code == sdk.OOM_EXIT_CODE:
            why = f"out of memory on {m.arch} (device {job.gpu_index}, {device.memory_mib} MiB)"
        else:
            why = f"exit code {code}"
        return pb.AgentMessage(profile=pb.ProfileResult(
            key=m.key, arch=m.arch, ok=False, sample=m.sample,
            error=f"{why}; log tail: {job.log_tail(1000)}"))
    try:
        now = time.time()
        measured = Measured(cpu_cores=float(result.get("cpu_cores", 0.0)),
                            peak_rss_mib=float(result.get("peak_rss_mib", 0.0)),
                            window=profile_window(result.get("window"), (
                                now - (time.monotonic() - job.started_at) - 1.0, now)))
        compute, memory, cores = backend.demand(device, measured)
        versions = " ".join(v for v in (str(result.get("versions", "")),
                                        backend.versions()) if v)
        record = pb.ProfileRecord(
            key=m.key, arch=m.arch, compute_pct=compute, memory_mib=memory, cores=cores,
            iter_time_s=float(result["iter_time_s"]),
            iters_per_epoch=int(result["iters_per_epoch"]),
            data_fraction=float(result.get("data_fraction", 0.0)),
            setup_s=float(result.get("setup_s", 0.0)),
            eval_s_per_epoch=float(result.get("eval_s_per_epoch", 0.0)),
            versions=versions, measured_at=now,
            source=f"measured on {node} ({backend.name}, "
                   + (f"{int(result.get('iterations', m.iterations))} iterations)"
                      if result.get("iterations", 1) else
                      "the whole run: the program marks no iterations)"))
        return pb.AgentMessage(profile=pb.ProfileResult(key=m.key, arch=m.arch, ok=True,
                                                        profile=record, sample=m.sample))
    except (KeyError, ValueError, TypeError) as exc:
        return pb.AgentMessage(profile=pb.ProfileResult(
            key=m.key, arch=m.arch, ok=False, sample=m.sample,
            error=f"unreadable profile result: {exc}"))
