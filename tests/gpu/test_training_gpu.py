"""Training on a real CUDA GPU (marked `gpu`; skipped where there is none): mixed-
precision fused groups against separate `torch.amp` runs on the GPU, an fp16 member's
overflow isolated, fused transformers' attention batched without vmap's fallback,
backward-fused optimizer steps against the standard loop, and a search run end to end
through NVML (profiled by the Sampler, then trained on the GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from hypersack.core.train_options import parse_train_options  # noqa: E402
from hypersack.runner import amp, zoo  # noqa: E402
from hypersack.runner.fused import FusedGroup, Member  # noqa: E402
from hypersack.testing.fusion import (  # noqa: E402
    separate_amp_run,
    weight_gap,
    without_dropout,
)

CUDA = torch.device("cuda")
LOSS_RTOL = 1.6e-2  # torch.testing's bf16 tolerance, as the CPU tests take it
STEPS = 3
ROOT = Path(__file__).resolve().parents[2]


def _data(name: str) -> list[tuple[Any, Any]]:
    g = torch.Generator().manual_seed(3)
    if name == "bert_tiny":
        batches = [(torch.randint(1, 1000, (16, 32), generator=g),
                    torch.randint(0, 2, (16,), generator=g)) for _ in range(STEPS)]
    else:
        batches = [(torch.randn(16, 3, 32, 32, generator=g),
                    torch.randint(0, 10, (16,), generator=g)) for _ in range(STEPS)]
    return [(x.to(CUDA), y.to(CUDA)) for x, y in batches]


def _members(optimizer: str) -> list[Member]:
    if optimizer == "sgd":
        return [Member("m0", lr=0.02, momentum=0.9, seed=0),
                Member("m1", lr=0.01, momentum=0.5, weight_decay=1e-3, seed=1)]
    return [Member("m0", lr=2e-3, seed=0), Member("m1", lr=1e-3, weight_decay=1e-3, seed=1)]


@pytest.fixture(autouse=True)
def _no_tf32() -> Any:
    """float32 is float32 on the GPU too (TF32 would put the reference itself 1e-3 off)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("name,optimizer,precision", [
    ("resnet18", "sgd", "bf16"), ("resnet18", "sgd", "fp16"), ("bert_tiny", "adam", "bf16"),
    ("bert_tiny", "adam", "fp16")])
def test_mixed_precision_members_equal_separate_amp_runs(name: str, optimizer: str,
                                                         precision: str) -> None:
    make, batches = without_dropout(lambda: zoo.build(name)), _data(name)
    members = _members(optimizer)
    group = FusedGroup(make, members, optimizer=optimizer, precision=precision, device=CUDA)
    fused = [group.step(x, y).tolist() for x, y in batches]
    for k, m in enumerate(members):
        losses, state, scaler = separate_amp_run(make, m, batches, optimizer, precision,
                                                 device="cuda")
        assert [row[k] for row in fused] == pytest.approx(losses, rel=LOSS_RTOL, abs=1e-5)
        # Fusion adds no error beyond the precision's own: the member is as far from a
        # float32 run as the separate torch.amp run is.
        _, exact, _ = separate_amp_run(make, m, batches, optimizer, "fp32", device="cuda")
        amp_error = weight_gap(state, exact)
        assert 0 < amp_error and weight_gap(group.member_state(k), exact) <= 1.5 * amp_error
        if precision == "fp16":
            assert group.scales.state_dict(k)["scale"] == scaler.get_scale()
    assert group.diverged == []


def test_an_overflowing_fp16_member_skips_only_its_own_step() -> None:
    make, batches = without_dropout(lambda: zoo.build("resnet18")), _data("resnet18")
    members = _members("sgd")
    group = FusedGroup(make, members, precision="fp16", device=CUDA)
    huge = 2.0 ** 100  # member 1's scaled gradients overflow float16 at the second step
    fused = []
    for i, (x, y) in enumerate(batches):
        if i == 1:
            group.scales.scale[1] = huge
            before = group.member_state(1)
        losses = group.step(x, y)
        fused.append(float(losses[0]))
        if i == 1:
            assert all(torch.equal(group.member_state(1)[n], before[n])
                       for n, _ in make().named_parameters())
            assert float(group.scales.scale[1]) == huge / 2
    assert torch.isfinite(losses).all() and group.diverged == []
    # Member 0 went on as its own separate run, its scale untouched.
    losses0, _, scaler0 = separate_amp_run(make, members[0], batches, "sgd", "fp16",
                                           device="cuda")
    assert fused == pytest.approx(losses0, rel=LOSS_RTOL, abs=1e-5)
    assert float(group.scales.scale[0]) == scaler0.get_scale() == amp.INIT_SCALE


def test_a_diverging_member_is_masked_on_the_gpu() -> None:
    make, batches = without_dropout(lambda: zoo.build("resnet18")), _data("resnet18")
    group = FusedGroup(make, [_members("sgd")[0], Member("wild", lr=1e30, seed=1)],
                       precision="bf16", device=CUDA)
    for x, y in batches:
        group.step(x, y)
    assert group.diverged == ["wild"] and group.running == ["m0"]


@pytest.mark.parametrize("name", ["bert_tiny", "vit_tiny"])
def test_a_fused_transformer_runs_attention_batched_and_equals_separate_runs(name: str
                                                                             ) -> None:
    make = without_dropout(lambda: zoo.build(name))
    batches = _data("bert_tiny" if name == "bert_tiny" else "resnet18")
    members = _members("adam")
    group = FusedGroup(make, members, optimizer="adam", device=CUDA)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*batching rule.*")
        fused = [group.step(x, y).tolist() for x, y in batches]
    for k, m in enumerate(members):
        losses, _, _ = separate_amp_run(make, m, batches, "adam", "fp32", device="cuda")
        assert [row[k] for row in fused] == pytest.approx(losses, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
def test_backward_fusion_equals_the_standard_loop_on_the_gpu(optimizer: str) -> None:
    from hypersack.runner.torch_train import Stepper

    hyper = {"optimizer": optimizer, "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-3}
    batches = [(x.double(), y) for x, y in _data("resnet18")]
    weights = []
    for fusion in ("none", "backward"):
        torch.manual_seed(0)
        model = zoo.build("resnet18").to(CUDA).double().train()
        stepper = Stepper(model, hyper, parse_train_options({"optimizer_fusion": fusion}),
                          torch.amp.GradScaler("cuda", enabled=False))
        for x, y in batches:
            stepper.step(torch.nn.functional.cross_entropy(model(x), y))
        weights.append(model.state_dict())
    worst = max(float((a - b).abs().max()) for a, b in
                zip(weights[0].values(), weights[1].values(), strict=True)
                if a.is_floating_point())
    assert worst <= 1e-9


def test_a_search_runs_end_to_end_on_the_gpu(tmp_path: Path) -> None:
    """`hypersack run` with the NVML backend: the Sampler profiles ResNet-18 on this GPU,
    then both trials train on it and report."""
    space = tmp_path / "gpu.yaml"
    space.write_text(
        "name: gpu-smoke\nmodels: [resnet18]\n"
        "hyperparameters: {batch_size: [64], lr: [0.01, 0.05]}\n"
        "settings: {epochs: 1, retries: 0, fusion: \"off\"}\n"
        "program: {builtin: train, options: {dataset: synthetic, train_samples: 512, "
        "val_samples: 128}}\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "hypersack.cli.main", "run", str(space),
                           "--backend", "nvml", "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "COMPLETED, completed 2" in done.stdout, done.stdout[-2000:]
    listed = subprocess.run([sys.executable, "-m", "hypersack.cli.main", "profiles", "--db",
                             str(tmp_path / "state" / "run.db"), "--format", "json"],
                            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    (profile,) = json.loads(listed.stdout)
    # Measured through NVML on this GPU: its architecture, and the memory CUDA held.
    assert profile["arch"] == torch.cuda.get_device_name().split()[1].split("-")[0]
    assert profile["source"].startswith("measured") and "cuda" in profile["versions"]
    assert 0 < profile["demand"]["memory_mib"] < torch.cuda.get_device_properties(0) \
        .total_memory / 2**20
    assert 0 < profile["demand"]["compute_pct"] <= 100 and profile["iter_time_s"] > 0
