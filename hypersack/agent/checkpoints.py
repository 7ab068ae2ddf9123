"""A trial's checkpoints on a node: one folder per attempt, each starting from the newest
checkpoint an earlier attempt left, so that two attempts never write the same files."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

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
