"""What `hypersack nodes` shows, as messages: each node with its GPUs as the server and
their agents last saw them, and each architecture's sharing level."""

from __future__ import annotations

from dataclasses import asdict

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.server.service import SchedulerService


def node_messages(service: SchedulerService) -> list[pb.Node]:
    with service.locked():
        sessions = service.sessions()
        load = service.orch.gpu_load()
        nodes = service.orch.nodes()
    out = []
    for rec in nodes:
        s = sessions.get(rec.spec.name)
        gpus = []
        for g in rec.spec.gpus:
            trials, share = load.get((rec.spec.name, g.index), (0, 0.0))
            state = s.gpu_state.get(g.index) if s else None
            gpus.append(pb.Gpu(index=g.index, arch=g.arch, memory_mib=g.memory_mib, uuid=g.uuid,
                               trials=trials, compute_share=share,
                               utilization_pct=state.utilization_pct if state else 0.0,
                               memory_used_mib=state.memory_used_mib if state else 0,
                               sharing=state.sharing if state else "",
                               mps_restarts=state.mps_restarts if state else 0))
        out.append(pb.Node(name=rec.spec.name, cores=rec.spec.cores, draining=rec.draining,
                           connected=bool(s and s.connected),
                           last_seen_s=service.since(s.last_seen) if s else -1.0,
                           gpus=gpus, backend=s.backend if s else ""))
    return out


def sharing_messages(service: SchedulerService) -> list[pb.SharingLevel]:
    """Each architecture's oversubscription ratio in force, and what it was learned from."""
    with service.locked():
        levels = service.orch.sharing.levels()
    return [pb.SharingLevel(**{**asdict(lv), "workloads": [
        pb.WorkloadFit(**asdict(w)) for w in lv.workloads]}) for lv in levels]
