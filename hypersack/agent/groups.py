"""Fused groups on a node: a member's job inside its group's process, and what the
fused trainer (`hypersack.runner.fused_train`) is started with."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypersack.agent.launcher import Job, log
from hypersack.agent.output import open_regular
from hypersack.core import optim
from hypersack.core.train_options import trial_seed
from hypersack.core.types import WorkloadKey


@dataclass
class MemberJob(Job):
    """A member of a fused group: its own trial (its attempt, work directory, metrics
    file, exit) inside the group's process. It ends when its file says so or when the
    process ends; killing it asks the process to stop it (a stop file) and the others
    go on; the process itself is killed when no member is left to run."""

    group: Job | None = None
    siblings: list[MemberJob] = field(default_factory=list)

    @property
    def stop_path(self) -> Path:
        return self.workdir / "stop"

    @property
    def metrics_path(self) -> Path:
        """The group's process writes each member's metrics in the member's folder."""
        return self.workdir / "metrics.jsonl"

    def start(self, gated: bool = False) -> None:
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for p in (self.metrics_path, self.stop_path):
            p.unlink(missing_ok=True)
        if self.account is not None:
            self.give_workdir()  # the group's process writes its metrics here
        self.started_at = time.monotonic()

    def poll(self) -> int | None:
        if self.exit_code is not None:
            return self.exit_code
        assert self.group is not None
        if self.ended:
            self.exit_code = 0
        else:
            code = self.group.poll()
            if code is not None:
                self.new_metrics()  # its last lines, written before the process ended
                self.exit_code = 0 if self.ended or code == 0 else code
        return self.exit_code

    def kill(self) -> None:
        if self.killed_at is not None or self.exit_code is not None:
            return
        self.killed_at = time.monotonic()
        try:
            with open_regular(self.stop_path, "wb"):
                pass
        except OSError as exc:
            log.warning("%s: could not ask its group to stop it: %s", self.id, exc)
        if self.group is not None and all(m.killed_at is not None or m.exit_code is not None
                                          for m in self.siblings):
            self.group.kill()
        if self.group is not None and self.group.exit_code is not None:
            self.exit_code = self.group.exit_code

    def pids(self, children: dict[int, list[int]] | None = None) -> list[int]:
        return []  # the group's process is observed as a whole, never as one member

    def cap_log(self) -> bool:
        return False  # the group's log, capped with the group

    @property
    def log_path(self) -> Path:
        return self.group.log_path if self.group is not None else self.workdir / "log.txt"

    @property
    def kept_log_path(self) -> Path:
        return (self.group.kept_log_path if self.group is not None
                else self.workdir / "log.1.txt")


def fused_argv() -> list[str]:
    """The fused trainer's argument list (its members come in HYPERSACK_FUSED)."""
    return [sys.executable, "-m", "hypersack.runner.fused_train"]


def fused_spec(key: WorkloadKey, epochs: float, options: dict[str, Any],
               members: list[tuple[str, dict[str, Any], Path, Path | None]],
               checkpoints: list[Path] | None = None, stop_at: float = 0.0
               ) -> dict[str, Any]:
    """What `hypersack.runner.fused_train` reads from HYPERSACK_FUSED: the workload and,
    per member, its fusable hyperparameters (as the plain trainer defaults them), its
    metrics file, its stop file and its checkpoint folder; and the epoch the group stops
    at to be ranked (0: its last)."""
    out: list[dict[str, Any]] = []
    # The members' own optimizer (they share every hyperparameter that does not fuse).
    optimizer = str(members[0][1].get("optimizer", key.optimizer)) if members \
        else key.optimizer
    for trial_id, params, metrics, stop in members:
        member: dict[str, Any] = {"trial_id": trial_id, "metrics_file": str(metrics)}
        if stop is not None:
            member["stop_file"] = str(stop)
        member.update(optim.hyperparameters(optimizer, params))
        member["seed"] = trial_seed(options.get("seed", 0), params)  # as the plain trainer seeds it
        if checkpoints is not None:
            member["checkpoint_dir"] = str(checkpoints[len(out)])
        out.append(member)
    batch = int(members[0][1].get("batch_size", 64)) if members else 64
    # Their precision, also where it is no demand key (autocast; fp16 scales per member).
    precision = str(members[0][1].get("precision", key.precision)) if members \
        else key.precision
    spec = {"model": key.model, "batch_size": batch, "epochs": epochs,
            "optimizer": optimizer, "options": options, "members": out,
            "precision": precision}
    if stop_at > 0:
        spec["stop_at"] = stop_at
    return spec
