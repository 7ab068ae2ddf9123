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
    assert [r["metrics"]["epoch"] for r in t0[:-1]] == [1, 2]
    assert all(math.isfinite(r["metrics"]["loss"]) and 0 <= r["metrics"]["accuracy"] <= 1
               for r in t0[:-1])
    assert t0[-1]["end"] == "completed"  # each member's last line says how it ended
    t1 = [json.loads(line) for line in (tmp_path / "t1.jsonl").read_text().splitlines()]
    assert math.isnan(t1[0]["metrics"]["loss"])  # the scheduler ends it DIVERGED
    assert t1[-1] == {"t": t1[-1]["t"], "end": "diverged"}
    t2 = [json.loads(line) for line in (tmp_path / "t2.jsonl").read_text().splitlines()]
    assert [r.get("end") for r in t2] == ["stopped"]


def test_a_fused_profile_run_times_the_group_and_ends(tmp_path: Path) -> None:
    members = [{"trial_id": f"p{k}", "lr": 0.05, "seed": k,
                "metrics_file": str(tmp_path / f"p{k}.jsonl")} for k in range(2)]
    spec = {"model": "resnet18", "batch_size": 8, "epochs": 5, "members": members,
            "options": {"dataset": "synthetic", "train_samples": 400, "val_samples": 8}}
    profile = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, "-m", "hypersack.runner.fused_train"],
                          env={**os.environ, "HYPERSACK_FUSED": json.dumps(spec),
                               "HYPERSACK_PROFILE_FILE": str(profile),
                               "HYPERSACK_PROFILE_ITERATIONS": "3",
                               "HYPERSACK_PROFILE_WARMUP": "1"},
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(profile.read_text())
    assert result["iter_time_s"] > 0 and result["iters_per_epoch"] == 50
    assert "fused=2" in result["versions"]
    # A profile run trains no trial: no member reports.
    assert not any((tmp_path / f"p{k}.jsonl").exists() for k in range(2))


def test_an_adam_group_trains_and_bad_hyperparameters_are_refused(tmp_path: Path) -> None:
    from hypersack.agent.groups import fused_spec
    from hypersack.core.errors import InvalidInput
    from hypersack.core.types import WorkloadKey
    from hypersack.runner.fused_train import parse_spec

    key = WorkloadKey(model="resnet18", batch_size=16, optimizer="adamw")
    options = {"dataset": "synthetic", "train_samples": 32, "val_samples": 16}
    members = [(f"a{k}", {"optimizer": "adamw", "lr": 1e-3, "beta1": 0.8 + 0.1 * k},
                tmp_path / f"a{k}.jsonl", None) for k in range(2)]
    spec = fused_spec(key, 1, options, members)  # as the agent writes it
    assert spec["optimizer"] == "adamw" and spec["members"][1]["beta1"] == pytest.approx(0.9)
    parsed = parse_spec(json.dumps(spec))
    assert [m.beta1 for m in parsed.members] == pytest.approx([0.8, 0.9])
    done = subprocess.run([sys.executable, "-m", "hypersack.runner.fused_train"],
                          env={**os.environ, "HYPERSACK_FUSED": json.dumps(spec)},
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"a0": "completed",
                                                                "a1": "completed"}
    for bad in ({"beta1": 1.0}, {"lr": -1}, {"eps": "nan"}, {"weight_decay": "x"}):
        with pytest.raises(InvalidInput, match=next(iter(bad))):
            fused_spec(key, 1, options, [("b", {"optimizer": "adamw", **bad},
                                          tmp_path / "b.jsonl", None)])
    with pytest.raises(InvalidInput, match="unknown optimizer"):
        parse_spec(json.dumps({**spec, "optimizer": "lamb"}))


def _fused(tmp_path: Path, spec: dict[str, object]) -> dict[str, str]:
    done = subprocess.run([sys.executable, "-m", "hypersack.runner.fused_train"],
                          env={**os.environ, "HYPERSACK_FUSED": json.dumps(spec)},
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return {"stdout": done.stdout}


def _epochs(path: Path) -> list[int]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    path.unlink()
    return [int(r["metrics"]["epoch"]) for r in lines if "metrics" in r]


def test_a_fused_group_pauses_at_its_rung_and_resumes_from_checkpoints(tmp_path: Path
                                                                      ) -> None:
    import torch

    from hypersack.runner import zoo
    from hypersack.runner.torch_train import make_optimizer

    def member(k: int) -> dict[str, object]:
        return {"trial_id": f"t{k}", "lr": 0.05, "seed": k,
                "metrics_file": str(tmp_path / f"t{k}.jsonl"),
                "checkpoint_dir": str(tmp_path / f"t{k}" / "checkpoint")}

    options = {"dataset": "synthetic", "train_samples": 32, "val_samples": 16}
    spec = {"model": "bert_tiny", "batch_size": 16, "epochs": 2, "options": options,
            "members": [member(0), member(1)], "stop_at": 1}
    out = _fused(tmp_path, spec)
    assert "paused at epoch 1" in out["stdout"]
    assert _epochs(tmp_path / "t0.jsonl") == [1] and _epochs(tmp_path / "t1.jsonl") == [1]
    saved = torch.load(tmp_path / "t0" / "checkpoint" / "checkpoint.pt", weights_only=True)
    assert saved["epoch"] == 1
    # The plain trainer's format: a promoted trial may resume alone.
    model = zoo.build("bert_tiny")
    model.load_state_dict(saved["model"])
    make_optimizer("sgd", model, {"lr": 0.05}).load_state_dict(saved["optimizer"])
    # Promoted together: both resume after epoch 1 and train epoch 2.
    out = _fused(tmp_path, {**spec, "stop_at": 0})
    assert "resumed 2 members" in out["stdout"]
    assert _epochs(tmp_path / "t0.jsonl") == [2] and _epochs(tmp_path / "t1.jsonl") == [2]
    # With a member that has no checkpoint, the group starts from scratch (resumed, t0
    # would have had nothing left to train).
    out = _fused(tmp_path, {**spec, "epochs": 1, "stop_at": 0,
                            "members": [member(0), member(2)]})
    assert "starts from scratch" in out["stdout"]
    assert _epochs(tmp_path / "t0.jsonl") == [1] and _epochs(tmp_path / "t2.jsonl") == [1]
