"""Mixed-precision fused groups: bf16 (autocast, no scale) and fp16 (a loss scale per
member) equal K separate `torch.amp` runs within the tolerance torch.testing allows
those precisions; a member whose fp16 gradients overflow skips only its own step and
lowers only its own scale; a diverged member is masked as in fp32; and the fused trial
process trains, checkpoints and resumes in both precisions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = nn.functional

from hypersack.runner import amp, zoo  # noqa: E402
from hypersack.runner.fused import FusedGroup, Member  # noqa: E402
from hypersack.testing.fusion import separate_amp_run, weight_gap  # noqa: E402

# The losses: torch.testing's relative tolerance for bf16 (fp16's own, 1e-3, is finer
# than three steps of reduced precision keep: a separate fp16 run's losses are 1e-2 off
# its float32 run's here).
LOSS_RTOL = 1.6e-2
STEPS = 3


class SmallCNN(nn.Module):
    """Convolution, batch norm and a head: ResNet's layer kinds at a size that float16
    convolutions on a CPU (which lacks fast kernels for them) train in a moment."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                                      nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2), nn.BatchNorm2d(8),
                                      nn.ReLU())
        self.head = nn.Linear(8, 10)

    def forward(self, x: Any) -> Any:
        return self.head(self.features(x).mean(dim=(2, 3)))


def _no_dropout(name: str) -> Any:
    from hypersack.testing.fusion import without_dropout

    return without_dropout(SmallCNN if name == "small_cnn" else lambda: zoo.build(name))


def _data(name: str) -> list[tuple[Any, Any]]:
    g = torch.Generator().manual_seed(3)
    if name == "bert_tiny":
        return [(torch.randint(1, 1000, (8, 16), generator=g),
                 torch.randint(0, 2, (8,), generator=g)) for _ in range(STEPS)]
    side = 16 if name == "small_cnn" else 32
    return [(torch.randn(8, 3, side, side, generator=g), torch.randint(0, 10, (8,), generator=g))
            for _ in range(STEPS)]


MEMBERS = [Member("m0", lr=0.02, momentum=0.9, seed=0),
           Member("m1", lr=0.01, momentum=0.5, weight_decay=1e-3, seed=1)]


@pytest.mark.parametrize("name,optimizer,precision", [
    ("resnet18", "sgd", "bf16"), ("small_cnn", "sgd", "fp16"), ("small_cnn", "adam", "bf16"),
    ("bert_tiny", "adam", "bf16"), ("bert_tiny", "adam", "fp16"), ("bert_tiny", "sgd", "fp16")])
def test_mixed_precision_members_equal_separate_amp_runs(name: str, optimizer: str,
                                                         precision: str) -> None:
    make, batches = _no_dropout(name), _data(name)
    members = _members(optimizer)
    group = FusedGroup(make, members, optimizer=optimizer, precision=precision)
    fused = [group.step(x, y).tolist() for x, y in batches]
    for k, m in enumerate(members):
        losses, state, scaler = separate_amp_run(make, m, batches, optimizer, precision)
        assert [row[k] for row in fused] == pytest.approx(losses, rel=LOSS_RTOL, abs=1e-5)
        # The weights: the fused member is as far from the float32 run as the separate
        # torch.amp run is (the precision's own error), not farther: fusion adds none.
        _, exact, _ = separate_amp_run(make, m, batches, optimizer, "fp32")
        amp_error = weight_gap(state, exact)
        assert 0 < amp_error and weight_gap(group.member_state(k), exact) <= 1.5 * amp_error, \
            (name, precision, m.trial_id)
        if precision == "fp16":
            assert group.scales.state_dict(k) == scaler.state_dict()
    assert group.diverged == []


def _members(optimizer: str) -> list[Member]:
    return MEMBERS if optimizer == "sgd" else \
        [Member(m.trial_id, lr=m.lr / 10, weight_decay=m.weight_decay, seed=m.seed)
         for m in MEMBERS]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_an_overflowing_fp16_member_skips_only_its_own_step(optimizer: str) -> None:
    make, batches = _no_dropout("small_cnn"), _data("small_cnn")
    members = _members(optimizer)
    group = FusedGroup(make, members, precision="fp16", optimizer=optimizer)
    huge = 2.0 ** 100  # member 1's scaled gradients overflow float16 at the second step
    schedule = {1: huge, 2: amp.INIT_SCALE}
    fused = []
    for i, (x, y) in enumerate(batches):
        if i in schedule:
            group.scales.scale[1] = schedule[i]
        if i == 1:
            before = group.member_state(1)
        fused.append(group.step(x, y).tolist())
        if i == 1:
            # It skipped that step: weights unchanged, scale halved, not diverged.
            assert all(torch.equal(group.member_state(1)[n], before[n])
                       for n, _ in make().named_parameters())
            assert float(group.scales.scale[1]) == huge / 2
            assert group.running == ["m0", "m1"] and group.diverged == []
    # Then it stepped again from its kept state (momentum, Adam's moments and step
    # count), as a separate run whose GradScaler skipped the same step did, and unlike
    # one that never skipped.
    losses1, skipped, _ = separate_amp_run(make, members[1], batches, optimizer, "fp16",
                                    scale_at=schedule)
    _, never, _ = separate_amp_run(make, members[1], batches, optimizer, "fp16")
    assert [row[1] for row in fused] == pytest.approx(losses1, rel=LOSS_RTOL)
    if optimizer == "sgd":
        assert weight_gap(group.member_state(1), skipped) < 0.25 * weight_gap(never, skipped)
    else:  # Adam moves every weight by about lr a step, rounding too: its step counts
        steps = [float(group.member_checkpoint(k)[1][0]["step"]) for k in (0, 1)]
        assert steps == [3.0, 2.0]
    # Member 0 went on as its own separate run, its scale untouched.
    losses0, _, scaler0 = separate_amp_run(make, members[0], batches, optimizer, "fp16")
    assert [row[0] for row in fused] == pytest.approx(losses0, rel=LOSS_RTOL, abs=1e-5)
    assert float(group.scales.scale[0]) == scaler0.get_scale() == amp.INIT_SCALE


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_diverging_member_is_masked_in_mixed_precision(precision: str) -> None:
    make, batches = _no_dropout("small_cnn"), _data("small_cnn")
    members = [MEMBERS[0], Member("wild", lr=1e30, seed=1)]
    group = FusedGroup(make, members, precision=precision)
    for x, y in batches:
        group.step(x, y)
    assert group.diverged == ["wild"] and group.running == ["m0"]
    losses0, _, _ = separate_amp_run(make, MEMBERS[0], batches, "sgd", precision)
    group2 = FusedGroup(make, MEMBERS[:1], precision=precision)
    alone = [group2.step(x, y).tolist()[0] for x, y in batches]
    assert alone == pytest.approx(losses0, rel=LOSS_RTOL, abs=1e-5)


def test_the_loss_scale_grows_as_torch_amp_s(monkeypatch: pytest.MonkeyPatch) -> None:
    scales = amp.LossScales(3, True, torch.device("cpu"))
    live = torch.tensor([True, True, False])
    no = torch.tensor([False, False, False])
    scales.growth = torch.tensor([amp.GROWTH_INTERVAL - 1, 5, 7])
    scales.update(torch.tensor([False, True, False]), live)
    assert scales.scale.tolist() == [2 * amp.INIT_SCALE, amp.INIT_SCALE / 2, amp.INIT_SCALE]
    assert scales.growth.tolist() == [0, 0, 7]  # a masked member's stays
    scales.update(no, live)
    assert scales.growth.tolist() == [1, 1, 7]
    scales.scale[0] = 3e38  # growing would overflow float32: kept
    scales.growth[0] = amp.GROWTH_INTERVAL - 1
    scales.update(no, live)
    assert float(scales.scale[0]) == pytest.approx(3e38)


def _fused_run(tmp: Path, spec: dict[str, Any]) -> str:
    done = subprocess.run([sys.executable, "-m", "hypersack.runner.fused_train"],
                          env={**os.environ, "HYPERSACK_FUSED": json.dumps(spec)},
                          capture_output=True, text=True, timeout=240, cwd=tmp)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_fused_trial_process_trains_and_checkpoints_in_mixed_precision(
        tmp_path: Path, precision: str) -> None:
    from hypersack.agent.groups import fused_spec
    from hypersack.core.types import WorkloadKey

    # BERT-Tiny for fp16: float16 convolutions are slow on a CPU.
    model = "resnet18" if precision == "bf16" else "bert_tiny"
    key = WorkloadKey(model=model, batch_size=8, precision=precision)
    members = [(f"t{k}", {"lr": 0.01, "precision": precision, "seed": k},
                tmp_path / f"t{k}.jsonl", None) for k in range(2)]
    spec = fused_spec(key, 2, {"dataset": "synthetic", "train_samples": 16,
                               "val_samples": 8}, members,
                      checkpoints=[tmp_path / f"c{k}" for k in range(2)], stop_at=1)
    assert spec["precision"] == precision  # as the agent writes it
    out = _fused_run(tmp_path, spec)
    assert "paused at epoch 1" in out
    saved = torch.load(tmp_path / "c0" / "checkpoint.pt", weights_only=True)
    # The plain trainer's scaler loads it (fp16: the member's scale and tracker).
    scaler = torch.amp.GradScaler("cpu", enabled=precision == "fp16")
    scaler.load_state_dict(saved["scaler"])
    if precision == "fp16":
        assert scaler.get_scale() == amp.INIT_SCALE
    out = _fused_run(tmp_path, {**spec, "stop_at": 0})
    assert "resumed 2 members" in out
    rows = [json.loads(line) for line in (tmp_path / "t0.jsonl").read_text().splitlines()]
    epochs = [r["metrics"]["epoch"] for r in rows if "metrics" in r]
    assert epochs == [1, 2] and rows[-1]["end"] == "completed"
