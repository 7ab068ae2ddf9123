"""Fused training against separate processes, on this machine's CPU or its first GPU,
in one run.

For each model, precision and width K: throughput (training samples per second, all
members together) of one fused process training K members, against K separate processes
training one member each at the same time (a separate one in mixed precision is a plain
`torch.amp` run: autocast, and a GradScaler for fp16); their ratio; and the peak memory
per member (resident memory on the CPU; on a GPU, the peak GPU memory PyTorch
allocated). Each configuration runs in fresh processes (warm-up steps first). On a GPU,
start an MPS daemon first to measure separate processes as HyperSack's agents run them
(scripts/gpu_checks.sh does).

    python scripts/bench_fused.py                       # resnet18 and bert_tiny, K=1,2,4,8
    python scripts/bench_fused.py --models resnet18 --widths 1,4 --steps 3 --json
    python scripts/bench_fused.py --device cuda --precisions fp32,bf16,fp16 --batch 64
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def batch(model: str, size: int, seed: int):  # type: ignore[no-untyped-def]
    import torch

    g = torch.Generator().manual_seed(seed)
    if model in ("bert_tiny", "pythia_14m", "pythia_31m"):
        return torch.randint(1, 1000, (size, 64), generator=g), torch.randint(0, 2, (size,),
                                                                             generator=g)
    return torch.randn(size, 3, 32, 32, generator=g), torch.randint(0, 10, (size,), generator=g)


def worker(model: str, width: int, steps: int, warmup: int, size: int, threads: int,
           device: str = "cpu", precision: str = "fp32",
           compile: str = "none") -> dict[str, float]:
    """Train `width` fused members (width 1: one plain model, as a separate run does);
    `compile`: the fused pass's torch.compile mode, or none."""
    import torch

    sys.path.insert(0, str(ROOT))
    from hypersack.runner import amp
    from hypersack.runner.fused import FusedGroup, Member
    from hypersack.runner.zoo import build

    torch.set_num_threads(threads)
    on = torch.device(device)
    x, y = (t.to(on) for t in batch(model, size, 0))
    dtype = amp.dtype_of(precision)
    if width == 1:
        torch.manual_seed(0)
        net = build(model).to(on).train()
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        scaler = torch.amp.GradScaler(on.type, enabled=precision == "fp16")

        def step() -> None:
            opt.zero_grad()
            with torch.autocast(on.type, dtype=dtype or torch.bfloat16,
                                enabled=dtype is not None):
                out = net(x)
            scaler.scale(torch.nn.functional.cross_entropy(out.float(), y)).backward()
            scaler.step(opt)
            scaler.update()
    else:
        group = FusedGroup(lambda: build(model), [Member(f"t{k}", lr=0.01 * (k + 1),
                                                         momentum=0.9, seed=k)
                                                  for k in range(width)],
                           device=on, precision=precision,
                           compile=None if compile == "none" else compile)

        def step() -> None:
            group.step(x, y)

    def sync() -> None:
        if on.type == "cuda":
            torch.cuda.synchronize(on)

    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    elapsed = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated(on) / 2**20 if on.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return {"samples_per_s": width * size * steps / elapsed, "peak_rss_mib": peak}


def run(model: str, width: int, processes: int, args: argparse.Namespace,
        precision: str, compile: str = "none") -> dict[str, float]:
    """`processes` workers of `width` members each, started together; their sum."""
    # The machine's cores are shared fairly: all for one fused process, an equal part
    # for each of K separate ones.
    threads = max(1, (os.cpu_count() or 1) // processes)
    cmd = [sys.executable, __file__, "--worker", model, str(width), str(args.steps),
           str(args.warmup), str(args.batch), str(threads), args.device, precision, compile]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a worker failed: {model} K={width} x{processes} {precision}")
    results = [json.loads(o) for o in outs]
    return {"samples_per_s": sum(r["samples_per_s"] for r in results),
            "rss_per_member_mib": sum(r["peak_rss_mib"] for r in results) / (width * processes)}


def measure(model: str, precision: str, k: int, args: argparse.Namespace,
            compile: str = "none", separate: dict[str, float] | None = None,
            ) -> dict[str, object]:
    fused = run(model, k, 1, args, precision, compile if k > 1 else "none")
    separate = separate or run(model, 1, k, args, precision)
    return {"model": model, "precision": precision, "K": k, "compile": compile,
            "_separate": separate,
            "fused_samples_per_s": round(fused["samples_per_s"], 1),
            "separate_samples_per_s": round(separate["samples_per_s"], 1),
            "fused_over_separate": round(fused["samples_per_s"] / separate["samples_per_s"], 3),
            "fused_mib_per_member": round(fused["rss_per_member_mib"], 1),
            "separate_mib_per_member": round(separate["rss_per_member_mib"], 1)}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        model, width, steps, warmup, size, threads = sys.argv[2], *map(int, sys.argv[3:8])
        print(json.dumps(worker(model, width, steps, warmup, size, threads, *sys.argv[8:11])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet18,bert_tiny")
    ap.add_argument("--widths", default="1,2,4,8")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the first GPU)")
    ap.add_argument("--precisions", default="fp32",
                    help="comma-separated: fp32, bf16, fp16 (mixed precision: on a GPU)")
    ap.add_argument("--compile", default="none",
                    help="comma-separated modes of the fused pass, each measured against the "
                         "same separate run: none (eager), default, reduce-overhead, "
                         "max-autotune-no-cudagraphs (torch.compile's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for model in args.models.split(","):
        for precision in args.precisions.split(","):
            for k in map(int, args.widths.split(",")):
                separate = None
                for mode in args.compile.split(","):
                    if k == 1 and mode != args.compile.split(",")[0]:
                        continue  # width 1 is the plain model: nothing to compile
                    row = measure(model, precision, k, args, mode, separate)
                    separate = row.pop("_separate")  # type: ignore[assignment]
                    rows.append(row)
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'model':<10}{'prec':>5}{'K':>3}{'compile':>16}{'fused/s':>10}{'separate/s':>12}{'ratio':>8}"
              f"{'MiB/member fused':>18}{'separate':>10}")
        for r in rows:
            print(f"{r['model']:<10}{r['precision']:>5}{r['K']:>3}{r['compile']:>16}"
                  f"{r['fused_samples_per_s']:>10}{r['separate_samples_per_s']:>12}"
                  f"{r['fused_over_separate']:>8}{r['fused_mib_per_member']:>18}"
                  f"{r['separate_mib_per_member']:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
