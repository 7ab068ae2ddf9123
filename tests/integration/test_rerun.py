"""Edit and rerun just works (issue 36): the same state directory, ten `hypersack run`s
of edited spaces in a row, each needing a new profile; none hangs. Before, a rerun
submitted before its local agent registered, the profile job went to the node restored
from the last run and was dropped, and nothing gave it again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TRAIN = """
import sys
from hypersack.runner import sdk
lr = float(sys.argv[1])
for epoch in range(1, 3):
    sdk.iteration()
    sdk.report(step=epoch, loss=abs(lr - 0.01) / epoch)
"""


def test_ten_edited_reruns_in_one_state_directory(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    state = tmp_path / "state"
    for run in range(10):
        space = tmp_path / "space.yaml"
        # A new workload each time (as an edited program is): each run profiles it.
        space.write_text(f"""
name: edit
workload: prog-v{run}
hyperparameters: {{lr: [0.0{run + 1}, 0.1]}}
settings: {{epochs: 2}}
program: {{command: "{{python}} {{space_dir}}/train.py {{lr}}"}}
""")
        done = subprocess.run(
            [sys.executable, "-m", "hypersack.cli.main", "run", str(space), "--backend",
             "cpu", "--state-dir", str(state)],
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (run, done.stdout[-2000:], done.stderr[-3000:])
        assert f"edit-{run + 1}: COMPLETED, completed 2" in done.stdout, done.stdout[-2000:]
        assert "1 new workload(s) measured" in done.stdout
