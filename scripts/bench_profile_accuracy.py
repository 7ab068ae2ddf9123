"""Sampler accuracy: profile zoo models for ten iterations, then compare the run time the
profile infers for a whole trial with the run time the trial took.

It runs `hypersack run` (embedded server, local agent on the CPU, or the GPU where
NVML finds one) on a study of the given models, one trial each, then a second study of
the same workloads with other learning rates (which must send no profile job). Data:
`synthetic` at CIFAR-10 / IMDB shapes, capped to a short trial; with --data-dir the
real datasets instead. Reported per model: the profile (seconds per iteration, data
share, compute %, peak memory, set-up and evaluation time), the inferred run time
(set-up + epochs x (iterations x seconds per iteration + evaluation)), the measured
one (launch to exit, as the server saw it) and measured / inferred.

    python scripts/bench_profile_accuracy.py                      # 3 models on the CPU
    python scripts/bench_profile_accuracy.py --models shufflenet resnet18 --samples 6400
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import yaml

from hypersack.cli.main import main as cli
from hypersack.store.sqlite import SqliteStore


def study(name: str, models: list[str], lrs: list[float], args: argparse.Namespace) -> str:
    options: dict[str, object] = {"train_samples": args.samples, "val_samples": args.val_samples,
                                  "seq_len": args.seq_len}
    if args.data_dir:
        options["data_dir"] = args.data_dir
    else:
        options["dataset"] = "synthetic"
    return yaml.safe_dump({
        "name": name, "models": models,
        "hyperparameters": {"batch_size": [args.batch_size], "lr": lrs},
        "settings": {"epochs": args.epochs, "retries": 0},
        "program": {"builtin": "train", "options": options}})


def run(space: str, state: Path, backend: str) -> tuple[int, float, str]:
    path = state / "space.yaml"
    path.write_text(space)
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = cli(["run", str(path), "--backend", backend, "--state-dir", str(state)])
    text = out.getvalue()
    if code != 0:
        sys.exit(f"hypersack run failed ({code}):\n{text}")
    jobs = re.search(r"profile jobs: (\d+)", text)
    return int(jobs.group(1)) if jobs else -1, time.perf_counter() - t0, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["shufflenet", "mobilenet_v2", "bert_tiny"])
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--samples", type=int, default=3200, help="training samples per epoch")
    ap.add_argument("--val-samples", type=int, default=320)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--backend", default="auto", help="auto (NVML if a GPU answers), cpu")
    ap.add_argument("--data-dir", help="real CIFAR-10 / IMDB under this directory")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        jobs1, wall1, _ = run(study("acc", args.models, [0.01], args), state, args.backend)
        jobs2, wall2, _ = run(study("acc", args.models, [0.003], args), state, args.backend)
        store = SqliteStore(state / "run.db")
        profiles = {p.key.model: p for p in store.list_profiles()}
        trials = [t for t in store.list_trials() if t.study_id == "acc-1"]
        store.close()

    rows = []
    for t in sorted(trials, key=lambda t: args.models.index(t.key.model)):
        p = profiles[t.key.model]
        assert t.started_at is not None and t.finished_at is not None
        measured = t.finished_at - t.started_at
        inferred = p.run_time_s(t.epochs)
        rows.append({
            "model": t.key.model, "arch": p.arch, "batch_size": t.key.batch_size,
            "iters_per_epoch": p.iters_per_epoch, "iter_ms": round(p.iter_time_s * 1000, 1),
            "data_pct": round(100 * p.data_fraction, 1), "compute_pct": p.demand.compute_pct,
            "memory_mib": p.demand.memory_mib, "cores": p.demand.cores,
            "setup_s": round(p.setup_s, 2), "eval_s": round(p.eval_s_per_epoch, 2),
            "inferred_s": round(inferred, 2), "measured_s": round(measured, 2),
            "measured_over_inferred": round(measured / inferred, 3), "versions": p.versions})
    header = ("model", "arch", "iters_per_epoch", "iter_ms", "data_pct", "compute_pct",
              "memory_mib", "setup_s", "eval_s", "inferred_s", "measured_s",
              "measured_over_inferred")
    print(" | ".join(header))
    for r in rows:
        print(" | ".join(str(r[h]) for h in header))
    print(f"versions: {rows[0]['versions'] if rows else '-'}")
    print(f"first study: {jobs1} profile jobs, {wall1:.1f} s; second study (same workloads, "
          f"other learning rate): {jobs2} profile jobs, {wall2:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "profile_jobs": [jobs1, jobs2],
                                               "wall_s": [wall1, wall2]}, indent=2))


if __name__ == "__main__":
    main()
