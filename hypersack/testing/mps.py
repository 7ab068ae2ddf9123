"""A stand-in for `nvidia-cuda-mps-control`, for tests of the MPS module without a GPU:
it answers the control commands and records them."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

STAND_IN = """#!{python}
import json, os, signal, subprocess, sys
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
args = sys.argv[1:]
stdin = "" if args else sys.stdin.read()
with open(os.environ["MPS_STAND_IN_LOG"], "a") as f:
    f.write(json.dumps({{"args": args, "stdin": stdin.strip(),
                        "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "pipe": pipe,
                        "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}) + "\\n")
pidfile = os.path.join(pipe, "daemon.pid")
def alive():
    try:  # a zombie (killed, not yet reaped by init) is dead too
        pid = int(open(pidfile).read())
        return open(f"/proc/{{pid}}/stat").read().split()[2] != "Z"
    except Exception:
        return False
if os.environ.get("MPS_STAND_IN_BROKEN"):
    print("cannot start: permission denied", file=sys.stderr)
    sys.exit(1)
if args == ["-d"]:
    if not alive():
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
        open(pidfile, "w").write(str(p.pid))
    sys.exit(0)
if stdin.strip() == "get_server_list":
    sys.exit(0 if alive() else 1)
if stdin.strip() == "quit":
    if alive():
        os.kill(int(open(pidfile).read()), signal.SIGTERM)
    sys.exit(0)
sys.exit(2)
"""


def stand_in(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(STAND_IN.format(python=sys.executable))
    exe.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
            "MPS_STAND_IN_LOG": str(tmp_path / "mps.log")}


def commands(tmp_path: Path) -> list[dict[str, str]]:
    path = tmp_path / "mps.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def gone(pid: int) -> bool:
    for _ in range(100):
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False
