"""The researcher's daily loop on a real embedded server and agent (issue 36): a
program that crashes on some parameters fails only those trials, the exit status says
some trials did not complete, and the run's table says why each failed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.control import exit_code

PICKY = """
import sys
from hypersack.runner import sdk
lr = float(sys.argv[1])
if lr < 0.001:
    sys.exit(f"refusing lr {lr}: below 0.001")
for epoch in range(1, 3):
    sdk.iteration()
    sdk.report(step=epoch, loss=abs(lr - 0.01) / epoch)
"""


def test_a_crash_on_some_parameters_fails_only_those_trials(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PICKY)
    space = tmp_path / "space.yaml"
    # The first two trials (the first samples a profile takes) crash; the rest work.
    space.write_text("""
name: picky
hyperparameters: {lr: [0.0005, 0.0007, 0.0068, 0.0129]}
settings: {epochs: 2}
program: {command: "{python} {space_dir}/train.py {lr}"}
""")
    done = subprocess.run(
        [sys.executable, "-m", "hypersack.cli.main", "run", str(space), "--backend", "cpu",
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=180, env={**os.environ, "COLUMNS": "200"})
    out = done.stdout
    assert done.returncode == 3, (out[-3000:], done.stderr[-3000:])  # some did not complete
    assert "picky-1: COMPLETED" in out and "completed 2" in out and "failed 2" in out, out
    failed = [line for line in out.splitlines() if "FAILED" in line]
    assert len(failed) == 2, out
    for line in failed:  # each row says why, in one line
        assert "profile run" in line and "below 0.001" in line, line


def test_exit_codes_tell_a_script_whether_every_trial_completed() -> None:
    def study(state: str, **counts: int) -> pb.Study:
        return pb.Study(id="s", state=state, counts=counts)

    assert exit_code(study("COMPLETED", COMPLETED=4)) == 0
    assert exit_code(study("COMPLETED", COMPLETED=2, PRUNED=6)) == 0  # its pruner's doing
    assert exit_code(study("COMPLETED", COMPLETED=2, FAILED=1)) == 3
    assert exit_code(study("COMPLETED", COMPLETED=2, DIVERGED=1)) == 3
    assert exit_code(study("FAILED", FAILED=3)) == 1
    assert exit_code(study("CANCELLED", COMPLETED=1, CANCELLED=3)) == 1
    for command in (["run", "--help"], ["submit", "--help"], ["watch", "--help"]):
        text = subprocess.run([sys.executable, "-m", "hypersack.cli.main", *command],
                              capture_output=True, text=True, timeout=60).stdout
        assert "exit status: 0 when the study completed and every trial" in " ".join(
            text.split()), (command, text)


def test_the_quick_start_as_written_in_a_fresh_folder(tmp_path: Path) -> None:
    """The README's first command runs `hypersack run examples/quickstart.yaml` with the
    default, relative, state directory (.hypersack): trials started warm and cold alike
    find their directories (a warm one once failed every trial there)."""
    quickstart = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
    done = subprocess.run([sys.executable, "-m", "hypersack.cli.main", "run", str(quickstart)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "quickstart-1: COMPLETED, completed 20" in done.stdout, done.stdout[-3000:]
    assert (tmp_path / ".hypersack" / "run.db").is_file()


FUSED = """
name: fused-here
models: [resnet18]
hyperparameters:
  batch_size: [64]
  lr: [0.05, 0.02, 0.03, 0.01]
settings: {epochs: 1, retries: 0, fusion: on}
program: {builtin: train, options: {dataset: synthetic, train_samples: 64, val_samples: 16}}
"""


def test_a_fused_group_runs_under_the_default_relative_state_dir(tmp_path: Path) -> None:
    """`hypersack run` keeps its state in ./.hypersack: a fused group's process runs in
    a folder of its own, and the metrics files named to it must still be found from
    there (a relative path once failed every fused group and fused profile). The
    example profiles make width 4 the cheapest on an A100; `fusion: on` is written
    unquoted, as the docs write it (YAML reads it as a boolean)."""
    pytest.importorskip("torch")
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "fused.yaml").write_text(FUSED)
    done = subprocess.run(
        [sys.executable, "-m", "hypersack.cli.main", "run", "fused.yaml", "--backend", "fake",
         "--inventory", "1xA100-80GB@48", "--profiles",
         str(root / "examples" / "profiles-estimates.yaml")],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "fused-here-1: COMPLETED, completed 4" in done.stdout, done.stdout[-3000:]
    logs = [p.read_text() for p in (tmp_path / ".hypersack").rglob("log.txt")]
    assert any("hypersack.runner.fused_train" in t for t in logs), logs
