"""A fuzzer for the agent's command guard with a live oracle: random templates and
values; what the guard accepts is run against a PATH of stub programs that each leave a
mark when reached, and with values that leave a mark when they run as Python or shell
code. Nothing accepted without --allow-shell may leave one."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

from hypersack.agent.guard import CommandPolicy, CommandRefused
from hypersack.agent.launcher import argv_for
from hypersack.grid.space import Program

CODE = "__import__('pathlib').Path('PWNED').touch()"
STUBS = ("bash", "sh", "rbash", "env", "timeout", "nice", "perl", "find", "sudo", "flock",
         "script", "unshare", "strace", "watch", "gdb", "ipython", "python3.11-dbg",
         "node", "train", "awk", "xargs")


def stub_path(root: Path) -> Path:
    """`root`/bin: stub programs that each record in `root`/marks that they ran (perl
    and node only when given an option, not a script; `train` never), and a real
    `python` and `python3`."""
    folder = root / "bin"
    folder.mkdir()
    marks = root / "marks"
    marks.mkdir()
    for name in STUBS:
        stub = folder / name
        if name in ("perl", "node"):  # reached with a script is fine; with an option, not
            stub.write_text(f"#!/bin/sh\ncase \"$1\" in -*|'') : > '{marks}/{name}';; esac\n")
        elif name == "train":  # the operator's program: any arguments
            stub.write_text("#!/bin/sh\n")
        else:
            stub.write_text(f"#!/bin/sh\n: > '{marks}/{name}'\n")
        stub.chmod(0o755)
    (folder / "python").symlink_to(sys.executable)
    (folder / "python3").symlink_to(sys.executable)
    return folder


EXES = ["{python}", "python", "python3", "bash", "sh", "env", "timeout", "nice", "perl",
        "node", "train", "awk", "xargs", "{exe}"]
WORDS = ["-c", "-m", "-I", "-u", "-uc", "-W", "ignore", "-X", "dev", "-Wignore", "-bB",
         "--check-hash-based-pycs", "always", "-", "--", "script.py", "timeit", "okmod",
         "-n", "1", "{code}", "{flag}", "{mod}", "-{flag}", "--lr={lr}", "{lr}", "-s",
         "-S", "-E", "-e", "-ne", "-exec", "x=1", "-{flag}c", "{flag}{code}", "KILL", "60"]
VALUES = {"code": [CODE, "touch PWNED", f"-c{CODE}"],
          "flag": ["-c", "-m", "-", "-I", "--", "x", "c", "-ic"],
          "mod": ["timeit", "okmod", "runpy", "code"],
          "lr": ["0.1", "-c", "1e-5", "; touch PWNED", "$(touch PWNED)", CODE],
          "exe": ["bash", "python", "sh"]}


def fuzz(seed: int, count: int, work: Path, bin_dir: Path) -> tuple[int, int, int]:
    """`count` random templates with random values: returns (tried, accepted, ran).
    Runs every accepted one, and fails if any left a mark."""
    rng = random.Random(seed)
    marks = bin_dir.parent / "marks"
    (work / "script.py").write_text("import sys\n")
    policies = [CommandPolicy.parse("*", allow_shell=False, allow_modules="okmod"),
                CommandPolicy.parse("python,train", allow_shell=False)]
    env = {"PATH": str(bin_dir), "PYTHONDONTWRITEBYTECODE": "1"}
    tried = accepted = ran = 0
    for _ in range(count):
        words = [rng.choice(EXES)] + [rng.choice(WORDS) for _ in range(rng.randint(0, 5))]
        template = " ".join(words)
        values = {k: rng.choice(v) for k, v in VALUES.items()}
        policy = rng.choice(policies)
        tried += 1
        try:
            argv = argv_for(Program(command=template), values)
            argv = policy.check(template, "n1", argv=argv, path=str(bin_dir)) or argv
        except (CommandRefused, ValueError):
            continue
        accepted += 1
        try:
            subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=20)
        except subprocess.TimeoutExpired:
            pass
        ran += 1
        reached = sorted(p.name for p in marks.iterdir())
        if reached or (work / "PWNED").exists():
            raise AssertionError(f"the guard let a value run as code: {template!r} with "
                                 f"{values!r} reached {reached or 'inline code'}")
    return tried, accepted, ran


