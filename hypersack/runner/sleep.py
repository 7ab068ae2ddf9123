"""Built-in `sleep` workload: a trial that takes a set time and reports a synthetic loss.

For tests, demos and load runs of the control plane: it uses no CPU to speak of, so a
whole simulated cluster's trials fit on one machine. Options (program.options):
`seconds_per_epoch` (default 1.0) and `iters_per_epoch` (default 10). The loss falls
each epoch towards a value that depends on the hyperparameters (smallest near lr=3e-3).
"""

from __future__ import annotations

import math
import time

from hypersack.runner import sdk


def target_loss(params: dict[str, object]) -> float:
    lr = params.get("lr", 1e-3)
    bs = params.get("batch_size", 64)
    lr_f = float(lr) if isinstance(lr, (int, float)) and lr > 0 else 1e-3
    bs_f = float(bs) if isinstance(bs, (int, float)) else 64.0
    return round((math.log10(lr_f) + 2.5) ** 2 / 4 + bs_f / 10_000, 6)


def main() -> None:
    params = sdk.params()
    opts = sdk.options()
    per_epoch = float(opts.get("seconds_per_epoch", 1.0))
    iters = max(1, int(opts.get("iters_per_epoch", 10)))
    total = max(1, round(sdk.epochs() * iters))
    target = target_loss(params)
    print(f"sleep workload: {total} iterations of {per_epoch / iters:.3f} s, params {params}",
          flush=True)
    for i in range(1, total + 1):
        time.sleep(per_epoch / iters)
        sdk.iteration(iters_per_epoch=iters)
        if i % iters == 0 or i == total:
            epoch = math.ceil(i / iters)
            sdk.report(step=epoch, loss=target + 1.0 / (epoch + 1), epoch=epoch)
    print("done", flush=True)


if __name__ == "__main__":
    main()
