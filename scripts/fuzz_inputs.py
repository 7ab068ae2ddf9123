"""Hostile inputs through the CLI's file and flag boundaries, bounded in count and time.

Each case runs `hypersack validate|plan` in a child process (a hang is a timeout, a
traceback is any exit other than 0 or 2 or a "Traceback" on stderr). Cases are the
classes of the hardening issue (non-finite and huge numbers, huge ranges, wrong types,
binary files, directories, deep nesting, aliases, bad shorthand) plus random mutations
of the example search space. Reported per class: tried, tracebacks, hangs, and accepted
invalid inputs (exit 0 where the input is known to be invalid).

    python scripts/fuzz_inputs.py --random 100 --seconds 120
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILES = str(ROOT / "examples" / "profiles-estimates.yaml")
BASE = "name: f\nmodels: [resnet18]\nhyperparameters: {batch_size: [64], lr: [0.1]}\n"

NUMBERS = [".inf", "-.inf", ".nan", "1e400", "-1", "0", "1e300", "99999999999999999999",
           "'abc'", "[]", "{}", "null", "true", "1e-300"]


def spaces() -> list[tuple[str, str, bool]]:
    """(class, YAML text, invalid?) for search spaces."""
    out = []
    for n in NUMBERS:
        out.append(("settings number", BASE + f"settings: {{epochs: {n}}}\n", True))
        out.append(("settings number", BASE + f"settings: {{retries: {n}}}\n", n != "0"))
        out.append(("epochs hyperparameter",
                    BASE.replace("lr: [0.1]", f"epochs: [{n}]"), True))
        # YAML reads 1e400 (no dot) as the string '1e400': a valid string value.
        out.append(("hyperparameter value", BASE.replace("[0.1]", f"[{n}]"),
                    n in (".inf", "-.inf", ".nan", "[]", "{}")))
        out.append(("batch size", BASE.replace("[64]", f"[{n}]"), True))
    for spec in ("{distribution: uniform, low: 0, high: 1, num: 1000000000}",
                 "{distribution: uniform, low: 0, high: 1, step: 1.0e-300}",
                 "{distribution: int, low: 0, high: 100000000000000}",
                 "{distribution: loguniform, low: 0, high: 1, num: 3}",
                 "{distribution: uniform, low: .nan, high: 1, num: 3}"):
        out.append(("huge or bad range", BASE.replace("[0.1]", spec), True))
    out.append(("deep nesting", "a: " + "[" * 5000 + "]" * 5000 + "\n", True))
    out.append(("aliases", "a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n"
        for i in range(8)), True))
    out.append(("not a mapping", "- 1\n- 2\n", True))
    out.append(("markup in names", BASE.replace("lr: [0.1]", "tag: ['[/]', '\x1b[2J']"), True))
    return out


def clusters() -> list[tuple[str, str, bool]]:
    return [("shorthand", c, True) for c in
            ("", "2x4xA100-0GB", "99999999999x4xA100-80GB", "1x100000xA100-80GB",
             "1x4xA100-80GB@0", "[/]", "1x4xA100-1e400GB", "1x4xA100-80GB@1e400", ",,,")]


def mutate(rng: random.Random) -> str:
    text = (ROOT / "examples" / "sp1.yaml").read_text()
    chars = list(text)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(chars))
        op = rng.random()
        if op < 0.4:
            chars[i] = rng.choice("[]{}:,-&*!|>'\"#%@`0123456789.e\x00\t\n ")
        elif op < 0.7:
            del chars[i]
        else:
            chars.insert(i, rng.choice(NUMBERS))
    return "".join(chars)


def run(argv: list[str], timeout_s: float) -> tuple[str, int]:
    try:
        p = subprocess.run([sys.executable, "-m", "hypersack.cli.main", *argv],
                           capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                           check=False)
    except subprocess.TimeoutExpired:
        return "hang", -1
    if p.returncode not in (0, 2) or "Traceback" in p.stderr:
        return "traceback", p.returncode
    return "ok", p.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--random", type=int, default=60, help="random mutations to try")
    ap.add_argument("--seconds", type=float, default=300, help="stop after this long")
    ap.add_argument("--timeout-s", type=float, default=20, help="a case longer is a hang")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="hs-fuzz-"))
    stats: dict[str, dict[str, int]] = {}
    bad: list[str] = []
    started = time.monotonic()

    def record(cls: str, outcome: str, code: int, invalid: bool, what: str) -> None:
        s = stats.setdefault(cls, {"tried": 0, "tracebacks": 0, "hangs": 0,
                                   "accepted_invalid": 0})
        s["tried"] += 1
        if outcome == "traceback":
            s["tracebacks"] += 1
        elif outcome == "hang":
            s["hangs"] += 1
        elif invalid and code == 0:
            s["accepted_invalid"] += 1
        if outcome != "ok" or (invalid and code == 0):
            bad.append(f"{cls}: {outcome} (exit {code}): {what[:120]!r}")

    cases = [(c, t, inv, False) for c, t, inv in spaces()]
    cases += [("random mutation", mutate(rng), False, False) for _ in range(args.random)]
    binary = tmp / "binary.yaml"
    binary.write_bytes(bytes(range(256)) * 10)
    for i, (cls, text, invalid, _) in enumerate(cases):
        if time.monotonic() - started > args.seconds:
            break
        f = tmp / f"case{i}.yaml"
        f.write_text(text, errors="surrogateescape")
        for argv in (["validate", str(f)],
                     ["plan", str(f), "--cluster", "1x2xA100-80GB", "--profiles", PROFILES]):
            outcome, code = run(argv, args.timeout_s)
            record(cls, outcome, code, invalid, text)
    for cls, cluster, invalid in clusters():
        outcome, code = run(["plan", "examples/sp1.yaml", "--cluster", cluster, "--profiles",
                             PROFILES], args.timeout_s)
        record(cls, outcome, code, invalid, cluster)
    for what, path in (("binary file", binary), ("directory", tmp), ("missing", tmp / "no")):
        for argv in (["validate", str(path)],
                     ["plan", "examples/sp1.yaml", "--cluster", "1x1xA100-80GB",
                      "--profiles", str(path)]):
            outcome, code = run(argv, args.timeout_s)
            record(what, outcome, code, True, str(path))
    total = {k: sum(s[k] for s in stats.values())
             for k in ("tried", "tracebacks", "hangs", "accepted_invalid")}
    print(json.dumps({"total": total, "by_class": stats, "problems": bad[:20]}, indent=2))
    if bad:
        print(f"kept {tmp}: the inputs the problems name", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if total["tracebacks"] or total["hangs"] or total["accepted_invalid"] else 0


if __name__ == "__main__":
    sys.exit(main())
