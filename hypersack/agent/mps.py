"""NVIDIA MPS on the agent: one control daemon per GPU the agent manages. The only module
that runs the MPS binaries.

For each GPU the agent starts `nvidia-cuda-mps-control -d` with `CUDA_VISIBLE_DEVICES`
set to that GPU's UUID and its own pipe and log directories under the agent's work
directory; co-located trials connect as MPS clients through that pipe directory, with an
active-thread percentage from their compute share and a pinned-memory limit from their
memory demand plus headroom. The daemon is checked (`get_server_list`) and restarted
when it died; `quit` stops it when the agent stops, and a restarted agent quits what an
earlier one left. Without MPS (no binary, no permission, `--no-mps`, or a daemon that
does not come up) a GPU's trials time-slice, and the agent's State says which mode each
GPU is in. Nothing here changes a GPU's compute mode, clocks or other settings.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hypersack.core.types import GpuSpec

log = logging.getLogger(__name__)

BINARY = "nvidia-cuda-mps-control"
MPS, TIME_SLICING = "mps", "time-slicing"
COMMAND_TIMEOUT_S = 10.0
HEADROOM_MIB = 256  # per client, above its memory demand: the CUDA context and allocator
HEADROOM_SHARE = 0.10
PASSABLE = 0o711

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


@dataclass
class GpuMps:
    """One GPU's MPS state, as the agent reports it."""

    index: int
    uuid: str
    pipe_dir: Path
    log_dir: Path
    mode: str = TIME_SLICING
    restarts: int = 0
    reason: str = ""  # why it time-slices, or what the last restart was for


def thread_percentage(compute_pct: float) -> int:
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for a placement's compute share of one GPU."""
    if not math.isfinite(compute_pct):
        return 100
    return max(1, min(100, math.ceil(compute_pct)))


def memory_limit_mib(memory_mib: int) -> int:
    """The pinned device-memory limit: the demand plus headroom."""
    return memory_mib + max(HEADROOM_MIB, math.ceil(memory_mib * HEADROOM_SHARE))


class MpsControl:
    """The MPS daemons of one agent. `runner` runs a command (subprocess.run's
    signature); tests put a stand-in `nvidia-cuda-mps-control` on PATH instead."""

    def __init__(self, root: Path, devices: Sequence[GpuSpec], *, enabled: bool = True,
                 binary: str | None = None, env: dict[str, str] | None = None,
                 runner: Runner = subprocess.run) -> None:
        self.root = root
        self._env = dict(os.environ if env is None else env)
        self._run = runner
        self.binary = (binary or shutil.which(BINARY, path=self._env.get("PATH"))) \
            if enabled else None
        self.gpus: dict[int, GpuMps] = {}
        for d in devices:
            part = f"gpu{d.index}"
            self.gpus[d.index] = GpuMps(d.index, d.uuid, root / "mps" / part / "pipe",
                                        root / "mps" / part / "log")
        why = "--no-mps" if not enabled else f"no {BINARY} on PATH"
        for g in self.gpus.values():
            g.reason = why if self.binary is None else ""

    # ------------------------------------------------------------- the daemon
    def _daemon_env(self, g: GpuMps) -> dict[str, str]:
        env = dict(self._env)
        if g.uuid:
            env["CUDA_VISIBLE_DEVICES"] = g.uuid
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(g.pipe_dir)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(g.log_dir)
        return env

    def _call(self, g: GpuMps, args: list[str], stdin: str | None = None
              ) -> subprocess.CompletedProcess[str] | None:
        """Run the control binary for one GPU. Its output goes to a file, not a pipe: a
        daemon that keeps the descriptors it inherited would hold a pipe open forever."""
        assert self.binary is not None
        try:
            with tempfile.TemporaryFile() as out:
                done = self._run([self.binary, *args], input=stdin,
                                 env=self._daemon_env(g), stdout=out, stderr=out,
                                 text=True, timeout=COMMAND_TIMEOUT_S, check=False)
                out.seek(0)
                text = out.read(4096).decode(errors="replace")
            return subprocess.CompletedProcess(done.args, done.returncode, text)
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("GPU %d: %s %s: %s", g.index, BINARY, " ".join(args) or stdin, exc)
            return None

    def alive(self, g: GpuMps) -> bool:
        done = self._call(g, [], stdin="get_server_list\n")
        return done is not None and done.returncode == 0

    def _start_one(self, g: GpuMps) -> None:
        # Trials may run as other users (--run-as): they pass through to the pipe.
        g.pipe_dir.mkdir(mode=PASSABLE, parents=True, exist_ok=True)
        g.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for d in (g.pipe_dir.parent, g.pipe_dir.parent.parent, g.pipe_dir):
            d.chmod(PASSABLE)
        done = self._call(g, ["-d"])
        if done is not None and done.returncode == 0 and self.alive(g):
            g.mode, g.reason = MPS, ""
            return
        detail = "" if done is None else done.stdout.strip()[:200]  # with stderr
        g.mode = TIME_SLICING
        g.reason = f"{BINARY} -d failed" + (f": {detail}" if detail else "")
        log.warning("GPU %d: MPS is not available, trials time-slice (%s)", g.index,
                    g.reason)

    def start(self) -> None:
        """Quit what an earlier agent left in these pipe directories, then start a
        daemon per GPU."""
        if self.binary is None:
            return
        for g in self.gpus.values():
            if g.pipe_dir.exists() and self.alive(g):
                log.warning("GPU %d: quitting the MPS daemon an earlier agent left", g.index)
                self._call(g, [], stdin="quit\n")
            self._start_one(g)

    def check(self) -> list[int]:
        """Restart the daemons that died; the GPUs it restarted."""
        restarted = []
        for g in self.gpus.values():
            if g.mode != MPS or self.alive(g):
                continue
            g.restarts += 1
            log.warning("GPU %d: the MPS daemon died; restarting it (restart %d)", g.index,
                        g.restarts)
            self._start_one(g)
            if g.mode == MPS:
                g.reason = f"restarted {g.restarts} time(s)"
            restarted.append(g.index)
        return restarted

    def stop(self) -> None:
        for g in self.gpus.values():
            if g.mode == MPS:
                self._call(g, [], stdin="quit\n")
                g.mode, g.reason = TIME_SLICING, "stopped"

    # ------------------------------------------------------------- clients
    def client_env(self, gpu_index: int, compute_pct: float, memory_mib: int | None
                   ) -> dict[str, str]:
        """What a trial on that GPU needs to be an MPS client (nothing: time-slicing).
        The client sees one device (its GPU by UUID), so the memory limit names 0."""
        g = self.gpus.get(gpu_index)
        if g is None or g.mode != MPS:
            return {}
        env = {"CUDA_MPS_PIPE_DIRECTORY": str(g.pipe_dir),
               "CUDA_MPS_LOG_DIRECTORY": str(g.log_dir),
               "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(thread_percentage(compute_pct))}
        if memory_mib:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory_limit_mib(memory_mib)}M"
        return env

    def mode(self, gpu_index: int) -> tuple[str, int]:
        g = self.gpus.get(gpu_index)
        return (g.mode, g.restarts) if g else (TIME_SLICING, 0)
