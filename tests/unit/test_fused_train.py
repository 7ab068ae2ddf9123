"""The fused trial process: three trials of ResNet-18 in one process on synthetic data,
each reporting to its own metrics file; one diverges, one is stopped, one completes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")


def test_a_fused_process_reports_each_member_as_its_own_trial(tmp_path: Path) -> None:
    stop = tmp_path / "t2.stop"
    stop.write_text("")  # stopped before its first step
    members = [
        {"trial_id": "t0", "lr": 0.05, "seed": 0, "metrics_file": str(tmp_path / "t0.jsonl")},
        {"trial_id": "t1", "lr": 1e30, "seed": 1, "metrics_file": str(tmp_path / "t1.jsonl")},
        {"trial_id": "t2", "lr": 0.05, "seed": 2, "metrics_file": str(tmp_path / "t2.jsonl"),
         "stop_file": str(stop)},
    ]
    spec = {"model": "resnet18", "batch_size": 16, "epochs": 2, "members": members,
            "options": {"dataset": "synthetic", "train_samples": 48, "val_samples": 16}}
    done = subprocess.run([sys.executable, "-m", "hypersack.runner.fused_train"],
                          env={**os.environ, "HYPERSACK_FUSED": json.dumps(spec)},
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome == {"t0": "completed", "t1": "diverged", "t2": "stopped"}
    t0 = [json.loads(line) for line in (tmp_path / "t0.jsonl").read_text().splitlines()]
    assert [r["metrics"]["epoch"] for r in t0] == [1, 2]
    assert all(math.isfinite(r["metrics"]["loss"]) and 0 <= r["metrics"]["accuracy"] <= 1
               for r in t0)
    (t1,) = [json.loads(line) for line in (tmp_path / "t1.jsonl").read_text().splitlines()]
    assert math.isnan(t1["metrics"]["loss"])  # the scheduler ends it DIVERGED
    assert not (tmp_path / "t2.jsonl").exists()
