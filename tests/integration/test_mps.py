"""A real agent process with MPS, against the stand-in `nvidia-cuda-mps-control` of
tests/unit/test_mps.py: trials are MPS clients of their GPU's daemon, the server shows
each GPU's sharing mode, and a stopped agent leaves no daemon behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from hypersack.testing.cluster import Cluster, space_yaml, wait_for
from hypersack.testing.cluster import done as _done
from hypersack.testing.cluster import submit as _submit
from hypersack.testing.mps import commands, gone, stand_in

ENV_PRINTER = """
import os
for name in sorted(os.environ):
    if name.startswith("CUDA"):
        print(f"ENV {name}={os.environ[name]}")
"""


def test_an_agent_runs_its_trials_as_mps_clients_and_stops_its_daemons(
        cluster: Cluster, tmp_path: Path) -> None:
    env = stand_in(tmp_path)
    script = tmp_path / "env.py"
    script.write_text(ENV_PRINTER)
    cluster.start_server()
    cluster.start_agent("n1", "2xA100-80GB@48", env={k: env[k] for k in
                                                     ("PATH", "MPS_STAND_IN_LOG")})
    wait_for("two MPS daemons", lambda: sum(c["args"] == ["-d"]
                                            for c in commands(tmp_path)) == 2, 30)
    with cluster.client() as c:
        wait_for("the agent's state", lambda: [g.sharing for n in c.nodes()
                                               for g in n.gpus] == ["mps", "mps"], 30)
    study = _submit(cluster, space_yaml("mps", models="[resnet18]", batch_sizes="[64]",
                                        lrs="[0.001]", retries=0,
                                        program=f"{{command: '{{python}} {script}'}}"))
    (trial,) = _done(cluster, study, 60)
    assert trial.state == "COMPLETED", trial.log_tail
    seen = dict(line[4:].split("=", 1) for line in trial.log_tail.splitlines()
                if line.startswith("ENV "))
    assert seen["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"  # its stated 40 % share
    assert seen["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2256M"  # 2000 MiB + headroom
    assert seen["CUDA_MPS_PIPE_DIRECTORY"].endswith(f"gpu{trial.gpu_index}/pipe")
    pids = [int(p.read_text()) for p in (cluster.tmp / "work" / "n1").glob("mps/*/pipe/daemon.pid")]
    assert len(pids) == 2
    proc = cluster.agents.pop("n1")
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(30)
    assert [c["stdin"] for c in commands(tmp_path)].count("quit") == 2
    assert all(gone(pid) for pid in pids)
