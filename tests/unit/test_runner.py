"""The built-in train program: datasets, options, and real training and profile runs."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hypersack.core.errors import InvalidInput
from hypersack.core.train_options import TrainOptions, parse_train_options
from hypersack.runner import datasets, sdk


def write_cifar(root: Path, per_batch: int = 20) -> None:
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                b"labels": list(rng.integers(0, 10, per_batch))}
        with open(base / name, "wb") as f:
            pickle.dump(data, f)


def write_imdb(root: Path) -> None:
    for split in ("train", "test"):
        for cls, text in (("pos", "A great, great film!<br />Loved it."),
                          ("neg", "Dull and far too long")):
            d = root / "aclImdb" / split / cls
            d.mkdir(parents=True)
            for i in range(3):
                (d / f"{i}_7.txt").write_text(f"{text} {i}")


def run_train(params: dict[str, object], options: dict[str, object], epochs: float,
              workdir: Path, profile: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, sdk.ENV_PARAMS: json.dumps(params), sdk.ENV_EPOCHS: str(epochs),
           sdk.ENV_OPTIONS: json.dumps(options),
           sdk.ENV_METRICS: str(workdir / "metrics.jsonl")}
    if profile:
        env[sdk.ENV_PROFILE] = str(workdir / "profile.json")
        env[sdk.ENV_PROFILE_ITERATIONS] = "4"
    return subprocess.run([sys.executable, "-m", "hypersack.runner.train"], env=env,
                          capture_output=True, text=True, timeout=240, cwd=workdir)


def metric_lines(workdir: Path) -> list[dict[str, float]]:
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["metrics"] for line in lines]


def test_missing_cifar_says_where_to_put_it_and_offers_synthetic(tmp_path: Path) -> None:
    opts = TrainOptions(data_dir=str(tmp_path))
    with pytest.raises(datasets.DatasetMissing) as info:
        datasets.load("resnet18", opts)
    msg = str(info.value)
    assert str(tmp_path) in msg and "cifar-10-batches-py/data_batch_1..5" in msg
    assert "cifar-10-python.tar.gz" in msg and "dataset: synthetic" in msg


def test_cifar_pickles_load_and_caps_take_a_seeded_sample(tmp_path: Path) -> None:
    write_cifar(tmp_path)
    data = datasets.load("shufflenet", TrainOptions(data_dir=str(tmp_path)))
    assert data.train.x.shape == (100, 3, 32, 32) and data.train.x.dtype == np.uint8
    assert data.val.size == 20 and data.classes == 10
    capped = datasets.load("shufflenet", TrainOptions(data_dir=str(tmp_path), train_samples=30,
                                                      val_samples=5))
    assert (capped.train.size, capped.val.size) == (30, 5)


def test_imdb_folder_is_tokenized_hashed_framed_and_cached(tmp_path: Path) -> None:
    write_imdb(tmp_path)
    assert datasets.words("A great, great film!<br />Loved it.") == [
        "a", "great", ",", "great", "film", "!", "loved", "it", "."]
    data = datasets.load("bert_tiny", TrainOptions(data_dir=str(tmp_path), seq_len=16), 30522)
    assert data.train.x.shape == (6, 16) and sorted(data.train.y.tolist()) == [0, 0, 0, 1, 1, 1]
    row = data.train.x[0]
    assert row[0] == datasets.CLS and (row[1:11] >= datasets.SPECIAL).all()
    assert row[11] == datasets.SEP and (row[12:] == datasets.PAD).all()
    assert (tmp_path / "aclImdb" / ".hypersack-train-16.npz").is_file()
    again = datasets.load("bert_tiny", TrainOptions(data_dir=str(tmp_path), seq_len=16), 30522)
    assert (again.train.x == data.train.x).all()  # from the cache, the same ids
    small_vocab = datasets.load("bert_tiny", TrainOptions(data_dir=str(tmp_path), seq_len=16), 50)
    assert small_vocab.train.x.max() < 50


def test_synthetic_only_by_name_and_of_the_model_shapes() -> None:
    opts = TrainOptions(dataset="synthetic", train_samples=64, seq_len=32)
    img = datasets.load("resnet18", opts)
    assert img.name == "synthetic-cifar10" and img.train.size == 64 and img.val.size == 12
    x, y = img.train.batch(np.arange(70))  # beyond the pool: repeats
    assert x.shape == (70, 3, 32, 32) and y.shape == (70,)
    text = datasets.load("pythia_14m", opts, 50304)
    assert text.train.x.shape[1] == 32 and text.classes == 2
    with pytest.raises(InvalidInput, match="trains on cifar10"):
        datasets.load("resnet18", TrainOptions(dataset="imdb"))
    with pytest.raises(InvalidInput, match=r"program\.options: epochs_x: Extra inputs"):
        parse_train_options({"epochs_x": 1})


def test_digits_are_bundled_and_split_the_same_way_every_time() -> None:
    data = datasets.digits()
    assert (data.train.size, data.val.size, data.classes) == (1437, 360, 10)
    assert data.train.x.shape == (1437, 64) and 0 <= data.train.x.min() <= data.train.x.max() <= 1
    assert (datasets.digits().val.y == data.val.y).all()


def test_digits_mlp_learns_and_reports_each_epoch(tmp_path: Path) -> None:
    done = run_train({"model": "digits_mlp", "lr": 0.03, "batch_size": 16, "momentum": 0.9},
                     {}, 3, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = metric_lines(tmp_path)
    assert [m["epoch"] for m in lines] == [1, 2, 3]
    assert lines[-1]["loss"] < lines[0]["loss"] and lines[-1]["accuracy"] > 0.9
    assert 0 <= lines[-1]["data_fraction"] < 1 and lines[-1]["iter_time_s"] > 0


def test_missing_dataset_fails_the_trial_with_the_message(tmp_path: Path) -> None:
    done = run_train({"model": "resnet18", "batch_size": 8}, {"data_dir": str(tmp_path)}, 1,
                     tmp_path)
    assert done.returncode == 2
    assert "error: CIFAR-10 not found" in done.stderr and str(tmp_path) in done.stderr


@pytest.mark.parametrize("model", ["shufflenet", "bert_tiny"])
def test_zoo_model_trains_and_profiles_on_the_cpu(tmp_path: Path, model: str) -> None:
    pytest.importorskip("torch")
    options = {"dataset": "synthetic", "train_samples": 64, "val_samples": 32, "seq_len": 32}
    done = run_train({"model": model, "batch_size": 16, "lr": 0.01}, options, 2, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = metric_lines(tmp_path)
    assert [m["epoch"] for m in lines] == [1, 2] and all(0 <= m["accuracy"] <= 1 for m in lines)
    # A profile run of a trial shorter than warm-up + timed iterations is measured on
    # what it ran (two iterations: one warm-up, one timed), never longer than the trial.
    prof_dir = tmp_path / "p"
    prof_dir.mkdir()
    done = run_train({"model": model, "batch_size": 16}, {**options, "train_samples": 32}, 1,
                     prof_dir, profile=True)
    assert done.returncode == 0, done.stderr
    result = json.loads((prof_dir / "profile.json").read_text())
    assert result["iterations"] == 1 and result["iters_per_epoch"] == 2
    assert result["iter_time_s"] > 0 and result["setup_s"] > 0
    assert result["eval_s_per_epoch"] > 0 and "torch=" in result["versions"]
    assert not (prof_dir / "metrics.jsonl").exists()  # no epoch report inside the timing


@pytest.mark.parametrize("marks,timed", [(1, 1), (3, 2), (30, 10)])
def test_a_profile_measures_what_a_short_program_runs(tmp_path: Path, marks: int,
                                                      timed: int) -> None:
    program = ("from hypersack.runner import sdk\nimport time\ntime.sleep(0.3)\n"
               f"for _ in range({marks}):\n    time.sleep(0.01)\n"
               "    sdk.iteration(iters_per_epoch=5)\nprint('trained')\n")
    env = {**os.environ, sdk.ENV_PROFILE: str(tmp_path / "profile.json"),
           sdk.ENV_PROFILE_ITERATIONS: "10", sdk.ENV_PROFILE_WARMUP: "1"}
    began = time.time()
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    ended = time.time()
    assert done.returncode == 0, done.stderr
    # Ten timed iterations end the run early; fewer, and the program runs to its end.
    assert ("trained" in done.stdout) == (marks < 11)
    result = json.loads((tmp_path / "profile.json").read_text())
    assert result["iterations"] == timed and result["iters_per_epoch"] == 5
    assert 0.009 < result["iter_time_s"] < 5
    # The timed iterations' span on the wall clock, without the 0.3 s start before them
    # (the agent reads the GPU's use over it); a single mark is timed from the import.
    start, end = result["window"]
    assert began < start <= end < ended
    if marks > 1:
        assert start - began > 0.3 and end - start >= 0.9 * timed * 0.01


def test_whole_numbers_stay_integers_in_commands() -> None:
    from hypersack.agent.launcher import argv_for
    from hypersack.grid.space import Program

    argv = argv_for(Program(command="./t --epochs {epochs} --lr {lr} --bs {batch_size}"),
                    {"epochs": 6.0, "lr": 0.5, "batch_size": 64})
    assert argv == ["./t", "--epochs", "6", "--lr", "0.5", "--bs", "64"]
