"""MPS on the agent, without a GPU: the real control flow of `agent.mps` against a
stand-in `nvidia-cuda-mps-control` that the test puts on PATH. The stand-in records
every command it gets (arguments, stdin, the GPU and pipe directory in its environment)
and plays the daemon with a sleeping process, which a test can kill."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from hypersack.agent.mps import MPS, TIME_SLICING, MpsControl, memory_limit_mib
from hypersack.core.types import GpuSpec
from hypersack.testing.mps import commands, gone, stand_in

GPUS = [GpuSpec(index=0, arch="A100", memory_mib=81920, uuid="GPU-aaaa"),
        GpuSpec(index=1, arch="A100", memory_mib=81920, uuid="GPU-bbbb")]


def daemon_pid(mps: MpsControl, index: int) -> int:
    return int((mps.gpus[index].pipe_dir / "daemon.pid").read_text())


def test_one_daemon_per_gpu_clients_and_a_clean_stop(tmp_path: Path) -> None:
    env = stand_in(tmp_path)
    mps = MpsControl(tmp_path / "node", GPUS, env=env)
    mps.start()
    starts = [c for c in commands(tmp_path) if c["args"] == ["-d"]]
    assert [(c["gpu"], Path(c["pipe"]).parent.name) for c in starts] == \
        [("GPU-aaaa", "gpu0"), ("GPU-bbbb", "gpu1")]
    assert all(str(tmp_path / "node") in c["pipe"] and c["log"] for c in starts)
    assert mps.mode(0) == (MPS, 0) and mps.mode(1) == (MPS, 0)
    env0 = mps.client_env(0, compute_pct=37.2, memory_mib=3000)
    assert env0["CUDA_MPS_PIPE_DIRECTORY"] == str(mps.gpus[0].pipe_dir)
    assert env0["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "38"
    assert env0["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={memory_limit_mib(3000)}M"
    assert memory_limit_mib(3000) == 3300 and memory_limit_mib(100) == 356
    assert mps.client_env(1, 250.0, None)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    pids = [daemon_pid(mps, 0), daemon_pid(mps, 1)]
    mps.stop()
    assert [c["stdin"] for c in commands(tmp_path)][-2:] == ["quit", "quit"]
    assert all(gone(pid) for pid in pids)  # nothing left behind
    assert mps.mode(0)[0] == TIME_SLICING


def test_a_dead_daemon_is_restarted_and_said(tmp_path: Path) -> None:
    mps = MpsControl(tmp_path / "node", GPUS, env=stand_in(tmp_path))
    mps.start()
    os.kill(daemon_pid(mps, 1), signal.SIGKILL)
    assert gone(daemon_pid(mps, 1))
    assert mps.check() == [1]
    assert mps.mode(1) == (MPS, 1) and mps.mode(0) == (MPS, 0)
    assert "restarted 1 time" in mps.gpus[1].reason
    assert mps.check() == []  # alive again
    mps.stop()


def test_a_restarted_agent_quits_what_an_earlier_one_left(tmp_path: Path) -> None:
    env = stand_in(tmp_path)
    first = MpsControl(tmp_path / "node", GPUS[:1], env=env)
    first.start()
    old = daemon_pid(first, 0)  # the first agent was killed: its daemon lives on
    second = MpsControl(tmp_path / "node", GPUS[:1], env=env)
    second.start()
    assert gone(old)
    assert [c["stdin"] or c["args"] for c in commands(tmp_path)] == \
        [["-d"], "get_server_list", "get_server_list", "quit", ["-d"], "get_server_list"]
    second.stop()


@pytest.mark.parametrize("how,reason", [("off", "--no-mps"), ("missing", "no nvidia-cuda"),
                                        ("broken", "permission denied")])
def test_without_mps_trials_time_slice_and_say_why(tmp_path: Path, how: str,
                                                   reason: str) -> None:
    env = stand_in(tmp_path)
    if how == "missing":
        env["PATH"] = "/nonexistent"
    if how == "broken":
        env["MPS_STAND_IN_BROKEN"] = "1"
    mps = MpsControl(tmp_path / "node", GPUS, env=env, enabled=how != "off")
    mps.start()
    assert mps.mode(0) == (TIME_SLICING, 0) and reason in mps.gpus[0].reason
    assert mps.client_env(0, 50.0, 1000) == {}
    mps.stop()
