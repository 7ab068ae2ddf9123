"""The agent's state that its mixins (commands.LaunchCommands, polling.ProcessPolling,
acks.StreamReports) read and change, declared once for the type checker;
`agent.Agent.__init__` sets it."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.agent.checkpoints import Checkpoints
from hypersack.agent.devices import DeviceBackend
from hypersack.agent.fence import Lease
from hypersack.agent.launcher import Job
from hypersack.agent.mps import MpsControl
from hypersack.agent.procs import Records


class AgentFields:
    """Annotations only, and the one method both call (Agent's)."""

    node: str
    backend: DeviceBackend
    agent_dir: str
    mps: MpsControl | None
    checkpoints: Checkpoints
    records: Records
    lease: Lease
    jobs: dict[str, Job]  # by job key (trial#attempt, or a profile run's id)
    groups: dict[str, Job]  # fused groups' processes, by key
    jobs_lock: threading.Lock
    fenced_dir: Path
    _profile_keys: dict[str, pb.ProfileWorkload]

    if TYPE_CHECKING:
        def _send(self, outbox: queue.Queue[pb.AgentMessage | None], msg: pb.AgentMessage,
                  gpu_index: int) -> None: ...

        def keep_fence(self) -> None: ...
