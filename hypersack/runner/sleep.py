"""Built-in `sleep` workload: a trial that takes a set time and reports a synthetic loss.

For tests, demos and load runs of the control plane: it uses no CPU to speak of, so a
whole simulated cluster's trials fit on one machine. Options (program.options):
`seconds_per_epoch` (default 1.0) and `iters_per_epoch` (default 10). The loss falls
each epoch towards a value that depends on the hyperparameters (smallest near lr=3e-3).
`busy_fraction` (default 0): the share of each iteration spent computing instead of
sleeping, counted in CPU time, so trials that share too few cores really slow each other
down (scripts/cpu_learned_ratio.py learns a sharing level from it).
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path

from hypersack.runner import sdk


def target_loss(params: dict[str, object]) -> float:
    lr = params.get("lr", 1e-3)
    bs = params.get("batch_size", 64)
    lr_f = float(lr) if isinstance(lr, (int, float)) and lr > 0 else 1e-3
    bs_f = float(bs) if isinstance(bs, (int, float)) else 64.0
    return round((math.log10(lr_f) + 2.5) ** 2 / 4 + bs_f / 10_000, 6)


def spin(cpu_s: float) -> None:
    """Compute until this process has used `cpu_s` seconds of CPU (longer in wall time
    when other processes share its cores)."""
    end = time.process_time() + cpu_s
    x = 0
    while time.process_time() < end:
        for _ in range(1000):
            x += 1


def main() -> None:
    params = sdk.params()
    opts = sdk.options()
    per_epoch = float(opts.get("seconds_per_epoch", 1.0))
    iters = max(1, int(opts.get("iters_per_epoch", 10)))
    busy = min(1.0, max(0.0, float(opts.get("busy_fraction", 0.0))))
    total = max(1, round(sdk.epochs() * iters))
    target = target_loss(params)
    saved = sdk.checkpoint_path(".json")
    start = 0
    if saved is not None and saved.exists():
        start = min(total, int(json.loads(saved.read_text())["epoch"]) * iters)
        print(f"resumed after epoch {start // iters}", flush=True)
    print(f"sleep workload: {total - start} iterations of {per_epoch / iters:.3f} s, "
          f"params {params}", flush=True)
    step_s = per_epoch / iters
    for i in range(start + 1, total + 1):
        if busy:
            spin(busy * step_s)
        time.sleep((1.0 - busy) * step_s)
        sdk.iteration(iters_per_epoch=iters)
        if i % iters == 0 or i == total:
            epoch = math.ceil(i / iters)
            sdk.report(step=epoch, loss=target + 1.0 / (epoch + 1), epoch=epoch)
            if saved is not None and i < total and sdk.should_stop(epoch):
                state = json.dumps({"epoch": epoch})
                sdk.save_checkpoint(".json", functools.partial(Path.write_text, data=state))
                print(f"paused after epoch {epoch}", flush=True)
                return
    print("done", flush=True)


if __name__ == "__main__":
    main()
