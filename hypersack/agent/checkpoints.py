"""A trial's checkpoints on a node: one folder per attempt, each starting from the newest
checkpoint an earlier attempt left, so that two attempts never write the same files."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.agent.launcher import job_dir
from hypersack.core import trial_env as sdk

log = logging.getLogger(__name__)


def attempt_folder(root: Path, attempt: int) -> Path:
    """`root/attempt-N`, made once: a copy of the newest earlier attempt's folder that
    holds a complete file (a checkpoint written whole is renamed into place, so `*.tmp`
    files are left out), else of the files `root` itself holds (the layout before
    attempts had folders), else empty. Made under another name and renamed, so it is
    there whole or not at all."""
    mine = root / f"attempt-{attempt}"
    if mine.is_dir():
        return mine
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    earlier = sorted(((n, p) for p in root.iterdir() if p.is_dir()
                      and (n := _attempt_of(p.name)) is not None and 0 < n < attempt
                      and any(f.is_file() and not f.name.endswith(".tmp")
                              for f in p.iterdir())), reverse=True)
    tmp = root / f".attempt-{attempt}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if earlier:
        shutil.copytree(earlier[0][1], tmp, ignore=shutil.ignore_patterns("*.tmp"),
                        symlinks=True)
        log.info("%s: attempt %d resumes from attempt %d's checkpoint", root.parent.name,
                 attempt, earlier[0][0])
    else:
        tmp.mkdir(mode=0o700)
        for f in root.iterdir():
            if f.is_file() and not f.name.endswith(".tmp"):
                shutil.copy2(f, tmp / f.name)
    os.replace(tmp, mine)
    return mine


def _attempt_of(name: str) -> int | None:
    """N for a folder named `attempt-N`."""
    number = name.removeprefix("attempt-")
    return int(number) if number != name and number.isdigit() and len(number) < 10 else None


class Checkpoints:
    """A node's checkpoint folders: under `root` (the node's directory, or a folder every
    node sees, where a trial resumes on any node), one per trial, each attempt's inside;
    and the pruned trials whose folders are deleted once no attempt of theirs runs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dropped: set[tuple[str, str]] = set()  # (study, trial): to delete

    def trial(self, study_id: str, trial_id: str) -> Path:
        """A trial's checkpoint folder, the same for every attempt on this node (on any
        node, with a shared root); each attempt keeps its own inside."""
        return job_dir(self.root, study_id, trial_id) / "checkpoint"

    def attempt(self, study_id: str, trial_id: str, attempt: int) -> Path:
        """The attempt's own checkpoint folder, `checkpoint/attempt-N`, which starts as a
        copy of the newest checkpoint an earlier attempt left (attempt_folder). The
        attempt resumes from it and writes only there: two attempts of a trial, even at
        once, never write the same files."""
        return attempt_folder(self.trial(study_id, trial_id), attempt)

    def rung_env(self, m: pb.LaunchTrial) -> dict[str, str]:
        """The attempt's checkpoint folder and the epoch it stops at to be ranked, where
        the study's pruner pauses trials."""
        stop_at = sdk.epoch_count(m.stop_at_epoch)
        env = {sdk.ENV_CHECKPOINT_DIR: str(self.attempt(m.study_id, m.trial_id, m.attempt))}
        if stop_at > 0:
            env[sdk.ENV_STOP_AT_EPOCH] = repr(stop_at)
        return env

    def drop(self, study_id: str, trial_id: str) -> None:
        """A pruned trial: its folder goes once no attempt of it runs here."""
        self.dropped.add((study_id, trial_id))

    def delete_dropped(self, running: set[str]) -> None:
        """Delete the folders of dropped trials none of whose attempts is `running` here
        (a killed attempt may still be writing)."""
        for study_id, trial_id in list(self.dropped):
            if trial_id in running:
                continue
            self.dropped.discard((study_id, trial_id))
            folder = self.trial(study_id, trial_id)
            try:
                shutil.rmtree(folder)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("%s: cannot delete its checkpoint %s: %s", trial_id, folder, exc)
                continue
            log.info("%s: pruned; deleted its checkpoint", trial_id)
