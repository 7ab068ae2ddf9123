#!/usr/bin/env python3
"""Time to a target validation loss on real tasks on this machine's CPU, searched five
ways with `hypersack run` (embedded server, local CPU agent), the same trial budget each:

- `--task digits`: the digits perceptron (the quick start's NumPy model), learning rate
  x momentum, 27 trials of 27 epochs;
- `--task bert`: the zoo's bert_tiny (PyTorch) on synthetic token data at small size
  (512 training and 256 validation sequences of 32 tokens), Adam's learning rate x
  weight decay, 18 trials of 9 epochs.


  grid (9 learning rates x 3 momenta), random, TPE (Optuna), ASHA (random trials,
  rungs 1, 3, 9), TPE + ASHA

Each is run for several seeds (the search's seed and the trainer's); reported per
method: the wall time from submission until some trial reports a validation loss at
or below the target at any epoch (mean and range over seeds; "-" where none did), the
whole study's time, and the best final loss. Times are in seconds and as a ratio to
grid search's mean in the same run. A profile of the workload is measured once and
imported by every run, so no run pays for profiling.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from hypersack.core.types import TrialState
from hypersack.store.sqlite import SqliteStore

TASKS: dict[str, dict[str, Any]] = {
    "digits": {
        "base": {"models": ["digits_mlp"], "hyperparameters": {"batch_size": [32]},
                 "settings": {"epochs": 27, "retries": 1}},
        "options": {},
        "ranges": {"lr": {"distribution": "loguniform", "low": 1.0e-3, "high": 1.0},
                   "momentum": {"distribution": "uniform", "low": 0.0, "high": 0.95}},
        "grid": {"lr": {"distribution": "loguniform", "low": 1.0e-3, "high": 1.0, "num": 9},
                 "momentum": [0.0, 0.5, 0.9]},
        "trials": 27, "target": 0.03,
    },
    "bert": {
        "base": {"models": ["bert_tiny"],
                 "hyperparameters": {"batch_size": [32], "optimizer": ["adam"]},
                 "settings": {"epochs": 9, "retries": 1}},
        "options": {"dataset": "synthetic", "train_samples": 512, "val_samples": 256,
                    "seq_len": 32},
        "ranges": {"lr": {"distribution": "loguniform", "low": 1.0e-5, "high": 1.0e-1},
                   "weight_decay": {"distribution": "loguniform", "low": 1.0e-6,
                                    "high": 1.0e-1}},
        "grid": {"lr": {"distribution": "loguniform", "low": 1.0e-5, "high": 1.0e-1,
                        "num": 6},
                 "weight_decay": [1.0e-6, 1.0e-3, 1.0e-1]},
        "trials": 18, "target": 0.005,
    },
}
ASHA = {"type": "asha", "min_epochs": 1, "reduction_factor": 3}


def methods(task: dict[str, Any], trials: int, seed: int) -> dict[str, dict[str, Any]]:
    grid, ranges = task["grid"], task["ranges"]
    random = {"type": "random", "samples": trials, "seed": seed}
    tpe = {"type": "optuna", "sampler": "tpe", "trials": trials, "seed": seed}
    return {
        "grid": {"hyperparameters": grid, "search": {"type": "grid"}},
        "random": {"hyperparameters": ranges, "search": random},
        "tpe": {"hyperparameters": ranges, "search": tpe},
        "asha": {"hyperparameters": ranges, "search": random, "pruner": ASHA},
        "tpe+asha": {"hyperparameters": ranges, "search": tpe, "pruner": ASHA},
    }


def space(task: dict[str, Any], name: str, method: dict[str, Any], seed: int
          ) -> dict[str, Any]:
    base = task["base"]
    data = {**base, **method, "name": name.replace("+", "-")}
    data["hyperparameters"] = {**base["hyperparameters"], **method["hyperparameters"]}
    # Trials alone, for every method alike (a study with a pruner does not fuse yet).
    data["settings"] = {**base["settings"], "fusion": "off",
                        "objective": {"metric": "loss", "mode": "min"}}
    data["program"] = {"builtin": "train", "options": {**task["options"], "seed": seed}}
    return data


def run(data: dict[str, Any], state: Path, profiles: Path | None) -> Path:
    path = state / "space.yaml"
    state.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    argv = [sys.executable, "-m", "hypersack.cli.main", "run", str(path), "--backend", "cpu",
            "--state-dir", str(state)]
    if profiles is not None:
        argv += ["--profiles", str(profiles)]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return state / "run.db"


def outcome(db: Path, target: float) -> tuple[float | None, float, float]:
    """(seconds from submission to the first validation loss at or below the target that
    any trial reported, at any epoch; the study's seconds; the best loss of a completed
    trial). Reports are read from the trials' metrics files (one line per epoch, with
    the time it was written)."""
    store = SqliteStore(db)
    try:
        study = store.list_studies()[-1]
        trials = store.list_trials(study.id)
    finally:
        store.close()
    hits = []
    for path in (db.parent / "work").rglob("metrics.jsonl"):
        for line in path.read_text().splitlines():
            report = json.loads(line)
            if report["metrics"].get("loss", float("inf")) <= target:
                hits.append(report["t"] - study.submitted_at)
                break
    done = [t for t in trials if t.state == TrialState.COMPLETED and t.objective is not None]
    end = max((t.finished_at or 0.0) for t in trials) - study.submitted_at
    best = min((t.objective for t in done if t.objective is not None), default=float("inf"))
    return (min(hits) if hits else None), end, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", choices=sorted(TASKS), default="digits")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--trials", type=int, help="default: the task's")
    parser.add_argument("--target", type=float, help="default: the task's")
    parser.add_argument("--methods", default="grid,random,tpe,asha,tpe+asha")
    args = parser.parse_args()
    task = TASKS[args.task]
    args.trials = args.trials or task["trials"]
    args.target = args.target or task["target"]
    seeds = [int(s) for s in args.seeds.split(",")]
    chosen = args.methods.split(",")
    results: dict[str, list[tuple[float | None, float, float]]] = {m: [] for m in chosen}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # Measure the workload once; every run imports it.
        warm = methods(task, 1, 0)["random"]
        first = run(space(task, "warm", warm, 0), root / "warm", None)
        profiles = root / "profiles.yaml"
        subprocess.run([sys.executable, "-m", "hypersack.cli.main", "profiles", "export",
                        str(profiles), "--db", str(first)], check=True,
                       stdout=subprocess.DEVNULL)
        for seed in seeds:
            for name in chosen:
                data = space(task, name, methods(task, args.trials, seed)[name], seed)
                db = run(data, root / f"{name}-{seed}", profiles)
                results[name].append(outcome(db, args.target))
                hit, end, best = results[name][-1]
                print(f"seed {seed} {name:<9} to target "
                      f"{'-' if hit is None else f'{hit:.1f} s'}, study {end:.1f} s, "
                      f"best {best:.4f}", file=sys.stderr, flush=True)
    grid_hits = [h for h, _, _ in results.get("grid", []) if h is not None]
    base = statistics.mean(grid_hits) if grid_hits else None
    print(f"task {args.task}: target validation loss {args.target}, {args.trials} trials x "
          f"{task['base']['settings']['epochs']} epochs, seeds {args.seeds}")
    print(f"{'method':<10}{'reached':>8}{'to target (s)':>22}{'ratio':>7}{'study (s)':>11}"
          f"{'best loss':>16}")
    for name in chosen:
        rows = results[name]
        hits = [h for h, _, _ in rows if h is not None]
        ends = [e for _, e, _ in rows]
        bests = [b for _, _, b in rows]
        to_target = (f"{statistics.mean(hits):.1f} [{min(hits):.1f}-{max(hits):.1f}]"
                     if hits else "-")
        ratio = f"{statistics.mean(hits) / base:.2f}" if hits and base else "-"
        print(f"{name:<10}{len(hits):>5}/{len(rows):<2}{to_target:>22}{ratio:>7}"
              f"{statistics.mean(ends):>11.1f}{statistics.mean(bests):>9.4f} "
              f"±{statistics.pstdev(bests):.4f}")


if __name__ == "__main__":
    main()
