"""deploy/slurm/hypersack.sbatch under a real Slurm (slurmctld, slurmd and munged from
Debian's packages, one node, started by scripts/slurm_local.sh): a study runs to the end
through sbatch, and a scancel mid-study leaves no process behind and loses no trial; the
same script submitted again resumes the study."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypersack.cli.client import Client
from hypersack.store.sqlite import SqliteStore
from hypersack.testing.cluster import free_port, wait_for
from hypersack.wire import tls as _tls
from tests.conftest import EXAMPLES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "hypersack.sbatch"
LOCAL = ROOT / "scripts" / "slurm_local.sh"
NEEDED = ("slurmctld", "slurmd", "munged", "sbatch", "scancel", "squeue")
MISSING = [exe for exe in NEEDED if shutil.which(exe) is None]

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(bool(MISSING), reason=f"Slurm is not installed ({', '.join(MISSING)} "
                       "missing): `scripts/slurm_local.sh install` as root; .ci/run does"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm runs its daemons as root"),
]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    state = tmp_path_factory.mktemp("slurm")
    out = subprocess.run(["bash", str(LOCAL), "start", str(state)], capture_output=True,
                         text=True, timeout=120)
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERSACK_", "SLURM"))}
        env["SLURM_CONF"] = str(state / "slurm.conf")
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        yield env
    finally:
        subprocess.run(["bash", str(LOCAL), "stop", str(state)], timeout=120, check=False)


SPACE = """
name: {name}
models: [resnet18]
hyperparameters:
  batch_size: [64]
  lr: {lrs}
settings: {{epochs: {epochs}, retries: 1, oversubscription: {{A100: 1.0}}}}
program: {{builtin: sleep, options: {{seconds_per_epoch: {spe}, iters_per_epoch: 4}}}}
"""


def _sbatch(env: dict[str, str], home: Path, port: int, *args: str) -> str:
    agent_args = "--backend fake --inventory 1xA100-80GB@2"
    if os.geteuid() == 0:
        agent_args += " --allow-root-trials"  # CI runs as root
    job_env = {**env, "HYPERSACK_HOME": str(home), "HYPERSACK_PORT": str(port),
               "HYPERSACK_BIN": str(Path(sys.executable).parent),
               "HYPERSACK_AGENT_ARGS": agent_args,
               "HYPERSACK_SERVER_ARGS": "--heartbeat-interval-s 0.5 --heartbeat-timeout-s 5 "
                                        f"--profiles {EXAMPLES / 'profiles-estimates.yaml'}"}
    out = subprocess.run(["sbatch", "--nodes=1", f"--chdir={home.parent}",
                          f"--output={home.parent}/job-%j.out", str(SCRIPT), *args],
                         capture_output=True, text=True, env=job_env, timeout=60)
    assert out.returncode == 0, out.stderr
    match = re.search(r"Submitted batch job (\d+)", out.stdout)
    assert match, out.stdout
    return match.group(1)


def _queued(env: dict[str, str], job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                         text=True, env=env, timeout=30)
    return bool(out.stdout.strip())


def _job_line(env: dict[str, str], job: str) -> str:
    """The job's record in the completion log (jobcomp/filetxt)."""
    conf = Path(env["SLURM_CONF"]).read_text()
    log = Path(re.search(r"^JobCompLoc=(.*)$", conf, re.M).group(1))  # type: ignore[union-attr]
    lines = [x for x in log.read_text().splitlines() if f"JobId={job} " in x] \
        if log.exists() else []
    return lines[-1] if lines else ""


def _left_running(home: Path) -> list[str]:
    """Processes of this HyperSack (server, agents, trials): their command lines or
    working directories name its state directory."""
    import psutil
    left = []
    for p in psutil.process_iter(["pid", "cmdline", "cwd"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(home) in cmd or (p.info["cwd"] or "").startswith(str(home)):
            left.append(f"{p.info['pid']} {cmd}")
    return left


def _trials(home: Path) -> list:  # type: ignore[type-arg]
    store = SqliteStore(home / "hypersack.db")
    try:
        return list(store.list_trials())
    finally:
        store.close()


def test_a_study_runs_through_sbatch(slurm: dict[str, str], tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE.format(name="slurm", lrs="[0.001, 0.01, 0.1]", epochs=1,
                                  spe=0.5))
    home = tmp_path / "hs"
    job = _sbatch(slurm, home, free_port(), str(space))
    wait_for(f"job {job} to end", lambda: not _queued(slurm, job), 180, 0.5)
    out = (tmp_path / f"job-{job}.out").read_text()
    assert "study slurm-1 ended (exit 0)" in out, out
    assert "COMPLETED" in out
    assert "JobState=COMPLETED" in _job_line(slurm, job) and "ExitCode=0:0" in \
        _job_line(slurm, job)
    trials = _trials(home)
    assert len(trials) == 3 and {t.state.value for t in trials} == {"COMPLETED"}
    assert [t.launches for t in trials] == [1, 1, 1]
    assert not _left_running(home)


def test_scancel_leaves_no_process_and_no_lost_trial(slurm: dict[str, str],
                                                     tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    # Six trials of 3 s, one at a time on one GPU (ratio 1): scancel finds work running.
    space.write_text(SPACE.format(name="cancelled", epochs=2, spe=1.5,
                                  lrs="[0.001, 0.002, 0.003, 0.004, 0.005, 0.006]"))
    home = tmp_path / "hs"
    port = free_port()
    job = _sbatch(slurm, home, port, str(space))
    token = home / "admin.token"
    wait_for("the server to take the study", lambda: (home / "study").exists(), 120, 0.3)
    credentials = _tls.channel_credentials(home / "certs" / "ca.crt")

    def running() -> bool:
        with Client(f"127.0.0.1:{port}", timeout_s=5, token=token.read_text().strip(),
                    credentials=credentials) as client:
            return any(t.state == "RUNNING" for t in client.trials("cancelled-1"))

    wait_for("a trial running", running, 120, 0.3)
    subprocess.run(["scancel", job], check=True, env=slurm, timeout=30)
    wait_for(f"job {job} to end", lambda: not _queued(slurm, job), 120, 0.5)
    # Slurm's KillWait is 10 s here; everything must be gone well within it.
    wait_for("every process of the job to end", lambda: not _left_running(home), 30, 0.5)
    assert "JobState=CANCELLED" in _job_line(slurm, job)
    trials = _trials(home)
    assert len(trials) == 6, [t.id for t in trials]  # every record is there
    done = {t.id for t in trials if t.state.value == "COMPLETED"}
    assert len(done) < 6
    # The same script again, without a space: it resumes the study and finishes it.
    again = _sbatch(slurm, home, free_port())
    wait_for(f"job {again} to end", lambda: not _queued(slurm, again), 180, 0.5)
    out = (tmp_path / f"job-{again}.out").read_text()
    assert "resuming study cancelled-1" in out and "ended (exit 0)" in out, out
    trials = _trials(home)
    assert len(trials) == 6 and {t.state.value for t in trials} == {"COMPLETED"}
    # What had completed before the scancel was not run again.
    assert all(t.launches == 1 for t in trials if t.id in done)
    assert not _left_running(home)
