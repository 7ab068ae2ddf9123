"""Fuzz the agent's command guard with its live oracle (hypersack.testing.guard_fuzz):
random templates and values, every accepted one run against stub programs that record
being reached. Prints how many were tried, accepted and run; exits 1 on an escape.

    python scripts/fuzz_guard.py --seeds 20 --count 2000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from hypersack.testing.guard_fuzz import fuzz, stub_path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--count", type=int, default=1000, help="templates per seed")
    args = p.parse_args()
    totals = [0, 0, 0]
    started = time.monotonic()
    for seed in range(args.seeds):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            work = root / "work"
            work.mkdir()
            try:
                counts = fuzz(seed, args.count, work, stub_path(root))
            except AssertionError as exc:
                print(f"seed {seed}: ESCAPE: {exc}")
                return 1
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
        print(f"seed {seed}: tried {counts[0]}, accepted and ran {counts[2]}, no escape",
              flush=True)
    print(f"total: {totals[0]} templates with random values tried, {totals[1]} accepted, "
          f"{totals[2]} run; none reached a shell, a launcher or inline code "
          f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
