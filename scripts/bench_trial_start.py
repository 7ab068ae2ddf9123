#!/usr/bin/env python3
"""How soon trials start, cold (a new interpreter per trial) against warm (forked from a
process that imported their libraries once; `hypersack.agent.warm`), on this machine:

- `start`: from the launch (`Job.start`) to the trial's first reported iteration, for a
  small PyTorch MLP and for a plain Python program, cold and warm, median of N;
- `tpe`: TPE with ASHA, 20 trials x 9 epochs of a small CPU PyTorch MLP on synthetic
  data: `hypersack run` (warm, then `--no-warm-start`, each in a fresh state directory,
  profiling included) against Optuna in-process (TPESampler, SuccessiveHalvingPruner at
  the same rungs, 2 threads), the same program and seed;
- `sleep`: 1,000 trials of the built-in `sleep` program (1 s) on 48 slots (6 fake A100s
  holding 8 each) through `hypersack run`, warm and cold, against the ideal
  1,000 / 48 x 1 s.

Times in seconds, and each as a ratio to its baseline in the same run.

    python scripts/bench_trial_start.py                 # all three
    python scripts/bench_trial_start.py --part start --repeats 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypersack.agent.launcher import Job  # noqa: E402
from hypersack.agent.warm import WarmPool  # noqa: E402

MLP = textwrap.dedent("""
    import argparse, math, sys
    import torch
    from hypersack.runner import sdk
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--epochs", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()

    def run(lr, epochs, seed, report, samples=512, device="cpu"):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(samples, 32, generator=g).to(device)
        y = (x[:, :4].sum(1) > 0).long()
        vx = torch.randn(256, 32, generator=g).to(device)
        vy = (vx[:, :4].sum(1) > 0).long()
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 2)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        for epoch in range(1, epochs + 1):
            for i in range(0, samples, 64):
                opt.zero_grad()
                loss_fn(model(x[i:i + 64]), y[i:i + 64]).backward()
                opt.step()
                sdk.iteration(iters_per_epoch=samples // 64)
            with torch.no_grad():
                val = float(loss_fn(model(vx), vy))
            if not math.isfinite(val):
                val = 10.0
            if report(epoch, val):
                return val
        return val

    if __name__ == "__main__":
        run(a.lr, a.epochs, a.seed, lambda e, v: sdk.report(step=e, val_loss=v) and False,
            a.samples, a.device)
""")

PLAIN = "from hypersack.runner import sdk\nsdk.report(step=1, loss=1.0)\n"


def first_report_s(job: Job, timeout_s: float = 60.0) -> float:
    """Seconds from the start call to the first metrics line."""
    began = time.perf_counter()
    job.start()
    end = began + timeout_s
    while time.perf_counter() < end:
        if job.metrics_path.exists() and job.metrics_path.stat().st_size > 0:
            took = time.perf_counter() - began
            while job.poll() is None:
                time.sleep(0.01)
            return took
        if job.poll() is not None and not job.metrics_path.stat().st_size:
            raise RuntimeError(f"{job.id} ended without a report: {job.log_tail()}")
        time.sleep(0.002)
    raise RuntimeError(f"{job.id}: no report in {timeout_s} s")


def part_start(repeats: int, device: str = "cpu") -> None:
    print("time from launch to the first reported iteration (median of "
          f"{repeats}), s; the MLP on {device}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "mlp.py").write_text(MLP)
        (root / "plain.py").write_text(PLAIN)
        for name, script, preload in (("torch MLP", "mlp.py", ("torch",)),
                                      ("plain Python", "plain.py", ())):
            argv = [sys.executable, str(root / script), "--epochs", "1", "--device", device] \
                if script == "mlp.py" else [sys.executable, str(root / script)]
            times: dict[str, list[float]] = {"cold": [], "warm": []}
            pool = WarmPool(root / "warm", str(root), None)
            try:
                for mode in ("cold", "warm"):
                    for i in range(repeats + 1):
                        job = Job(f"{mode}{i}", 0, root / name.split()[0] / f"{mode}{i}",
                                  argv, {}, warm=pool if mode == "warm" else None,
                                  preload=("hypersack.runner.sdk", *preload))
                        took = first_report_s(job)
                        if mode == "warm" and i == 0:
                            pool.wait_ready(120)  # the first started the warm process
                            continue
                        if i or mode == "cold":
                            times[mode].append(took)
            finally:
                pool.close()
            cold, warm = statistics.median(times["cold"]), statistics.median(times["warm"])
            print(f"  {name:<13} cold {cold:7.3f}  warm {warm:7.3f}  warm/cold {warm / cold:.3f}"
                  f"  (cold/warm {cold / warm:.0f}x)", flush=True)


def hypersack_run(space: Path, state: Path, *extra: str) -> float:
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hypersack.cli.main", "run", str(space),
                           "--backend", "cpu", "--state-dir", str(state), *extra],
                          capture_output=True, text=True, timeout=1800)
    took = time.perf_counter() - began
    if done.returncode not in (0, 3):
        raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
    return took


def optuna_in_process(program: Path, seed: int, samples: int) -> tuple[float, float]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    namespace: dict[str, object] = {"__name__": "bench"}
    sys.argv = [str(program)]
    exec(compile(program.read_text(), str(program), "exec"), namespace)
    run = namespace["run"]
    lock = threading.Lock()

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("lr", 1e-3, 1.0, log=True)

        def report(epoch: int, value: float) -> bool:
            with lock:
                trial.report(value, epoch)
                return trial.should_prune()
        value = run(lr, 9, seed, report, samples)  # type: ignore[operator]
        if trial.should_prune():
            raise optuna.TrialPruned()
        return float(value)

    began = time.perf_counter()
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed),
                                pruner=optuna.pruners.SuccessiveHalvingPruner(
                                    min_resource=1, reduction_factor=3))
    study.optimize(objective, n_trials=20, n_jobs=2)
    return time.perf_counter() - began, study.best_value


def part_tpe(seed: int, samples: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        program = root / "mlp.py"
        program.write_text(MLP)
        space = root / "space.yaml"
        space.write_text(textwrap.dedent(f"""
            name: tpe-asha
            workload: bench-mlp
            hyperparameters:
              lr: {{distribution: loguniform, low: 1.0e-3, high: 1.0}}
            search: {{type: optuna, sampler: tpe, trials: 20, seed: {seed}}}
            pruner: {{type: asha, min_epochs: 1, reduction_factor: 3}}
            program:
              command: "{{python}} {program} --lr {{lr}} --epochs {{epochs}} --seed {seed}
                --samples {samples}"
              preload: [torch]
            settings: {{epochs: 9, objective: {{metric: val_loss, mode: min}}}}
        """))
        optuna_s, best = optuna_in_process(program, seed, samples)
        warm = hypersack_run(space, root / "warm")
        cold = hypersack_run(space, root / "cold", "--no-warm-start")
        print(f"TPE + ASHA, 20 trials x 9 epochs of a small CPU PyTorch MLP ({samples} "
              "samples an epoch), s (ratio to Optuna in-process)")
        print(f"  Optuna in-process (2 threads) {optuna_s:7.1f}  (1.00, best {best:.4f})")
        print(f"  hypersack run, warm           {warm:7.1f}  ({warm / optuna_s:.2f})")
        print(f"  hypersack run, cold           {cold:7.1f}  ({cold / optuna_s:.2f})",
              flush=True)


def part_sleep(trials: int, slots: int) -> None:
    per_gpu = 8
    gpus = max(1, slots // per_gpu)
    ideal = trials / (gpus * per_gpu) * 1.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        space = root / "sleep.yaml"
        space.write_text(textwrap.dedent(f"""
            name: sleepers
            models: [resnet18]
            hyperparameters:
              batch_size: [64]
              lr: {{distribution: uniform, low: 0.0, high: 1.0, num: {trials}}}
            program: {{builtin: sleep, options: {{seconds_per_epoch: 1.0}}}}
            settings:
              epochs: 1
              retries: 0
              oversubscription: {{A100: 1.0}}
              demand: {{compute_pct: {100 / per_gpu:.4f}, memory_mib: 100, cores: 0.1,
                        epoch_s: 1}}
        """))
        print(f"{trials} x 1 s sleep trials on {gpus * per_gpu} slots, s (ratio to the "
              f"ideal {ideal:.1f} s)")
        for mode, extra in (("warm", ()), ("cold", ("--no-warm-start",))):
            began = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "hypersack.cli.main", "run", str(space), "--backend",
                 "fake", "--inventory", f"{gpus}xA100-80GB@96", "--state-dir",
                 str(root / mode), *extra], capture_output=True, text=True, timeout=1800)
            took = time.perf_counter() - began
            if done.returncode != 0:
                raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
            print(f"  {mode}  {took:7.1f}  ({took / ideal:.2f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["start", "tpe", "sleep", "all"], default="all")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=48)
    ap.add_argument("--device", default="cpu",
                    help="where the start part's MLP trains (cuda: a CUDA context per trial)")
    ap.add_argument("--samples", type=int, default=16384,
                    help="training samples an epoch of the TPE + ASHA part's MLP")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.part in ("start", "all"):
        part_start(args.repeats, args.device)
    if args.part in ("tpe", "all"):
        part_tpe(args.seed, args.samples)
    if args.part in ("sleep", "all"):
        part_sleep(args.trials, args.slots)
    print(json.dumps({"python": sys.version.split()[0], "cores": os.cpu_count()}))


if __name__ == "__main__":
    main()
