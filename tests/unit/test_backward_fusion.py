"""Optimizer steps fused into the backward pass (`program.options.optimizer_fusion:
backward`): the same weights as the standard loop, in float64 to 1e-9, for SGD, Adam and
AdamW, with and without clipping; each gradient freed at its update; checkpoints that
either loop resumes; and the clipping modes and precisions it cannot take refused."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hypersack.core.errors import InvalidInput
from hypersack.core.train_options import TrainOptions, parse_train_options

torch = pytest.importorskip("torch")
nn = torch.nn

STEPS = 6


class Net(nn.Module):
    """A convolution, batch norm, a shared (tied) weight used twice, and a head: every
    kind of parameter the zoo has, and one whose gradient accumulates from two uses."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.mix = nn.Linear(16, 16)
        self.head = nn.Linear(16, 5)

    def forward(self, x: Any) -> Any:
        h = torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)).repeat(1, 4)
        h = torch.tanh(self.mix(h))
        h = torch.tanh(self.mix(h))  # the same weight again: its gradient accumulates
        return self.head(h)


def _batches() -> list[tuple[Any, Any]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 3, 6, 6, generator=g, dtype=torch.float64),
             torch.randint(0, 5, (8,), generator=g)) for _ in range(STEPS)]


def _train(params: dict[str, Any], options: dict[str, Any], steps: int = STEPS,
           start: dict[str, Any] | None = None, offset: int = 0
           ) -> tuple[Any, Any]:
    from hypersack.runner.torch_train import Stepper

    torch.manual_seed(0)
    model = Net().double()
    if start is not None:
        model.load_state_dict(start["model"])
    stepper = Stepper(model, params, parse_train_options(options),
                      torch.amp.GradScaler("cpu", enabled=False))
    if start is not None:
        stepper.optimizer.load_state_dict(start["optimizer"])
    for x, y in _batches()[offset:offset + steps]:
        stepper.step(nn.functional.cross_entropy(model(x), y))
    return model, stepper


HYPER = {
    "sgd": {"optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3},
    "adam": {"optimizer": "adam", "lr": 0.01, "weight_decay": 1e-3},
    "adamw": {"optimizer": "adamw", "lr": 0.01, "weight_decay": 0.1, "beta1": 0.8},
}


@pytest.mark.parametrize("clip", [{}, {"clip_grad_value": 0.02}])
@pytest.mark.parametrize("optimizer", sorted(HYPER))
def test_backward_fusion_trains_the_weights_the_standard_loop_does(
        optimizer: str, clip: dict[str, Any]) -> None:
    plain, _ = _train(HYPER[optimizer], {**clip})
    fused, stepper = _train(HYPER[optimizer], {"optimizer_fusion": "backward", **clip})
    n_params = len(list(fused.parameters()))
    assert stepper.fused is not None and stepper.fused.updates == STEPS * n_params
    worst = max(float((a - b).abs().max())
                for a, b in zip(plain.state_dict().values(), fused.state_dict().values(),
                                strict=True))
    assert worst <= 1e-9
    # Each gradient is gone once its parameter is updated: none outlives the step.
    assert all(p.grad is None for p in fused.parameters())
    # And the weights moved (the test compares training, not two untouched models).
    torch.manual_seed(0)
    untouched = Net().double()
    assert float((untouched.head.weight - fused.head.weight).detach().abs().max()) > 1e-4


class WithUnused(Net):
    """Net and a layer the loss never reaches: its parameters get no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Linear(3, 3)


@pytest.mark.parametrize("bucket", [1, 3, 100])
def test_buckets_update_once_their_gradients_are_final(bucket: int) -> None:
    from hypersack.runner.backward import BackwardFused

    def adam(params: Any) -> Any:
        return torch.optim.Adam(params, lr=0.01, weight_decay=1e-3)

    torch.manual_seed(0)
    ref = WithUnused().double()
    torch.manual_seed(0)
    model = WithUnused().double()
    opt = adam(ref.parameters())
    fused = BackwardFused(model.parameters(), adam, bucket_params=bucket)
    used = len(list(Net().parameters()))
    # The unused layer's two parameters come last: the first bucket backward fills
    # holds them, and only that bucket waits for finish().
    waiting = max(0, min(bucket, len(fused.params)) - 2)
    for x, y in _batches():
        opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        opt.step()
        before = fused.updates
        nn.functional.cross_entropy(model(x), y).backward()
        assert fused.updates - before == used - waiting  # during the backward pass
        fused.finish()
        assert fused.updates - before == used
    assert max(float((a - b).abs().max()) for a, b in
               zip(ref.state_dict().values(), model.state_dict().values(), strict=True)) <= 1e-9
    assert all(p.grad is None for p in model.parameters())
    # Saved in one optimizer's form, which torch.optim and other bucket sizes load.
    saved = fused.state_dict()
    assert saved["state"].keys() == opt.state_dict()["state"].keys()
    other = BackwardFused(WithUnused().double().parameters(), adam, bucket_params=2)
    other.load_state_dict(saved)
    assert other.state_dict()["state"].keys() == saved["state"].keys()


def test_clip_grad_value_takes_effect() -> None:
    # A tiny bound changes the result, so both loops above really clip.
    free, _ = _train(HYPER["sgd"], {})
    clipped, _ = _train(HYPER["sgd"], {"clip_grad_value": 1e-4})
    assert float((free.head.weight - clipped.head.weight).detach().abs().max()) > 1e-3


def test_clip_grad_norm_in_the_standard_loop_equals_torch_s() -> None:
    model, _ = _train(HYPER["adam"], {"clip_grad_norm": 0.05})
    torch.manual_seed(0)
    ref = Net().double()
    opt = torch.optim.Adam(ref.parameters(), lr=0.01, weight_decay=1e-3)
    for x, y in _batches():
        opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        opt.step()
    assert max(float((a - b).abs().max()) for a, b in
               zip(ref.state_dict().values(), model.state_dict().values(), strict=True)) <= 1e-12


@pytest.mark.parametrize("first,then", [("backward", "none"), ("none", "backward")])
def test_a_checkpoint_of_either_loop_resumes_in_the_other(first: str, then: str) -> None:
    whole, _ = _train(HYPER["adamw"], {})
    half, stepper = _train(HYPER["adamw"], {"optimizer_fusion": first}, steps=3)
    saved = {"model": half.state_dict(), "optimizer": stepper.optimizer.state_dict()}
    # The saved optimizer state is torch.optim's own form: a plain optimizer loads it.
    torch.optim.AdamW(Net().double().parameters()).load_state_dict(saved["optimizer"])
    resumed, _ = _train(HYPER["adamw"], {"optimizer_fusion": then}, steps=3, start=saved,
                        offset=3)
    assert max(float((a - b).abs().max()) for a, b in
               zip(whole.state_dict().values(), resumed.state_dict().values(),
                   strict=True)) <= 1e-9


def test_what_backward_fusion_cannot_take_is_refused_with_the_way_out() -> None:
    with pytest.raises(InvalidInput, match="clip_grad_value"):
        parse_train_options({"optimizer_fusion": "backward", "clip_grad_norm": 1.0})
    with pytest.raises(InvalidInput, match="one clipping mode"):
        parse_train_options({"clip_grad_norm": 1.0, "clip_grad_value": 1.0})
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidInput):
            parse_train_options({"clip_grad_value": bad})
    with pytest.raises(InvalidInput, match="optimizer_fusion"):
        parse_train_options({"optimizer_fusion": "forward"})
    from hypersack.runner.torch_train import Stepper

    with pytest.raises(InvalidInput, match="fp16"):
        Stepper(Net(), HYPER["sgd"], TrainOptions(optimizer_fusion="backward"),
                torch.amp.GradScaler("cpu", enabled=True))


def test_the_server_refuses_these_options_for_a_numpy_model() -> None:
    from hypersack.grid.runnable import check_runnable
    from hypersack.grid.space import parse_space

    space = parse_space({"name": "s", "models": ["digits_mlp"],
                         "hyperparameters": {"lr": [0.1], "batch_size": [32]},
                         "program": {"builtin": "train",
                                     "options": {"optimizer_fusion": "backward"}}})
    with pytest.raises(InvalidInput, match="NumPy"):
        check_runnable(space, "s.yaml")
    space = parse_space({"name": "s", "models": ["resnet18"],
                         "hyperparameters": {"lr": [0.1], "batch_size": [32]},
                         "program": {"builtin": "train",
                                     "options": {"optimizer_fusion": "backward",
                                                 "clip_grad_value": 1.0}}})
    check_runnable(space, "s.yaml")  # a PyTorch model takes them


@pytest.mark.parametrize("models,hyper,options,match", [
    (["resnet18"], {"precision": ["fp32", "fp17"]}, {}, "no 'fp17'; valid: fp32, bf16, fp16"),
    (["resnet18"], {"precision": ["bf16", "fp16"]}, {"optimizer_fusion": "backward"},
     "backward does not take precision fp16"),
    (["digits_mlp", "resnet18"], {"precision": ["fp32", "bf16"]}, {},
     "digits_mlp trains with NumPy fp32 only, not 'bf16'"),
    (["resnet18", "digits_mlp"], {"optimizer": ["sgd", "adam"]}, {},
     "digits_mlp trains with NumPy sgd only, not 'adam'"),
])
def test_trials_that_would_fail_as_they_start_are_refused_at_submission(
        models: list[str], hyper: dict[str, list[str]], options: dict[str, str],
        match: str) -> None:
    """What the trainer refuses as a trial starts (after its profile, with retries) is
    refused where the study is submitted and by `hypersack validate`."""
    from hypersack.grid.runnable import check_runnable
    from hypersack.grid.space import parse_space

    def space(hp: dict[str, list[str]], opts: dict[str, str]) -> Any:
        return parse_space({"name": "s", "models": models,
                            "hyperparameters": {"lr": [0.1], "batch_size": [32], **hp},
                            "program": {"builtin": "train", "options": opts}})

    with pytest.raises(InvalidInput, match=re.escape(match)):
        check_runnable(space(hyper, options), "s.yaml")
    # The same space without the offending value is taken.
    check_runnable(space({k: v[:1] for k, v in hyper.items()}, options), "s.yaml")


def test_the_server_knows_the_trainer_s_precisions() -> None:
    from hypersack.core.train_options import PRECISIONS
    from hypersack.runner import amp

    assert tuple(amp.DTYPES) == PRECISIONS


def _run_train(tmp: Path, options: dict[str, Any]) -> list[float]:
    from hypersack.runner import sdk

    metrics = tmp / f"m-{options.get('optimizer_fusion', 'none')}.jsonl"
    env = {**os.environ, sdk.ENV_PARAMS: json.dumps({"model": "resnet18", "lr": 0.05,
                                                     "optimizer": "adam",
                                                     "batch_size": 16}),
           sdk.ENV_EPOCHS: "2", sdk.ENV_METRICS: str(metrics),
           sdk.ENV_OPTIONS: json.dumps({"dataset": "synthetic", "train_samples": 48,
                                        "val_samples": 16, **options})}
    done = subprocess.run([sys.executable, "-m", "hypersack.runner.train"], env=env,
                          capture_output=True, text=True, timeout=240, cwd=tmp)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r["metrics"]["loss"] for r in rows if "metrics" in r]


def test_the_built_in_trainer_runs_a_trial_with_backward_fusion(tmp_path: Path) -> None:
    plain = _run_train(tmp_path, {"clip_grad_value": 0.5})
    fused = _run_train(tmp_path, {"optimizer_fusion": "backward", "clip_grad_value": 0.5})
    assert len(plain) == len(fused) == 2
    # float32: the same updates, so the same losses up to rounding.
    assert fused == pytest.approx(plain, rel=1e-4, abs=1e-5)
