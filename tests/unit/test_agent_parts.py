"""Agent pieces without a server: device backends, the launcher, the SDK, settings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hypersack.agent.devices import (
    CpuBackend,
    DeviceBackend,
    FakeBackend,
    Measured,
    make_backend,
)
from hypersack.agent.launcher import Job, argv_for
from hypersack.agent.nvml import arch_of
from hypersack.core.errors import InvalidInput
from hypersack.grid.space import Program
from hypersack.runner import sdk
from hypersack.testing.contracts import DeviceBackendContract
from hypersack.wire.settings import AgentSettings, ServerSettings, load_settings


def test_fake_backend_reports_its_inventory() -> None:
    b = FakeBackend("4xA100-80GB@88", node="n7")
    assert [d.arch for d in b.devices()] == ["A100"] * 4
    assert b.devices()[0].memory_mib == 80 * 1024 and b.cores() == 88
    assert b.devices()[3].uuid == "FAKE-n7-3"
    assert b.env_for(b.devices()[0])["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(InvalidInput, match="one node"):
        FakeBackend("2x4xA100-80GB")
    with pytest.raises(InvalidInput, match="needs an inventory"):
        make_backend("fake")
    with pytest.raises(InvalidInput, match="valid: auto, nvml, cpu, fake"):
        make_backend("tpu")


def test_cpu_backend_is_one_device_and_scales_demand_by_cores() -> None:
    b = CpuBackend()
    (d,) = b.devices()
    assert d.arch == "CPU" and d.memory_mib > 0
    compute, memory, cores = b.demand(d, Measured(cpu_cores=1.0, peak_rss_mib=40.4))
    assert compute == pytest.approx(100 / b.cores(), abs=0.01) and memory == 40 and cores == 1.0
    assert b.demand(d, Measured(0.0, 0.0)) == (1.0, 1, 0.01)  # floors keep demands positive


def test_arch_names_from_nvml() -> None:
    assert arch_of("NVIDIA A100-SXM4-80GB") == "A100"
    assert arch_of("NVIDIA H100 80GB HBM3") == "H100"
    assert arch_of("Tesla V100-SXM2-16GB") == "V100"


def test_command_template_fills_arguments_never_a_shell() -> None:
    p = Program(command="{python} train.py --lr {lr} --name '{model} run'")
    argv = argv_for(p, {"lr": "1; rm -rf /", "model": "resnet18"})
    assert argv == [sys.executable, "train.py", "--lr", "1; rm -rf /", "--name", "resnet18 run"]
    with pytest.raises(InvalidInput, match=r"no value for \{momentum\}"):
        argv_for(Program(command="x --m {momentum}"), {})
    assert argv_for(Program(builtin="sleep"), {})[1:] == ["-m", "hypersack.runner.sleep"]


def test_job_runs_reports_metrics_and_keeps_its_log(tmp_path: Path) -> None:
    code = "import hypersack, sys; hypersack.report(step=1, loss=0.5); " \
           "hypersack.report(step=2, loss=0.25, acc=1); print('bye'); sys.exit(4)"
    job = Job("t1", 0, tmp_path / "t1", [sys.executable, "-c", code], {})
    job.start()
    while job.poll() is None:
        pass
    assert job.exit_code == 4
    assert job.new_metrics() and job.metrics == {"loss": 0.25, "acc": 1.0} and job.step == 2
    assert "bye" in job.log_tail()


def test_job_kill_ends_the_process_group(tmp_path: Path) -> None:
    job = Job("t2", 0, tmp_path / "t2", [sys.executable, "-c", "import time; time.sleep(60)"], {})
    job.start()
    job.kill()
    while job.poll() is None:
        pass
    assert job.exit_code == 128 + 15


def test_profile_run_measures_iterations(tmp_path: Path) -> None:
    env = {**os.environ, sdk.ENV_PROFILE: str(tmp_path / "p.json"),
           sdk.ENV_PROFILE_ITERATIONS: "5", sdk.ENV_PROFILE_WARMUP: "1",
           sdk.ENV_OPTIONS: json.dumps({"seconds_per_epoch": 0.4, "iters_per_epoch": 4}),
           sdk.ENV_EPOCHS: "100"}
    subprocess.run([sys.executable, "-m", "hypersack.runner.sleep"], env=env, check=True,
                   timeout=30, capture_output=True)
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["iterations"] == 5 and result["iters_per_epoch"] == 4
    assert 0.09 < result["iter_time_s"] < 0.2 and result["cpu_cores"] < 0.5
    assert result["peak_rss_mib"] > 1


def test_the_sleep_workloads_busy_fraction_is_spent_computing(tmp_path: Path) -> None:
    """Half of each 0.1 s iteration in CPU time, whatever else runs on the machine (the
    wall time grows under load; the CPU time does not shrink)."""
    env = {**os.environ, sdk.ENV_PROFILE: str(tmp_path / "p.json"),
           sdk.ENV_PROFILE_ITERATIONS: "5", sdk.ENV_PROFILE_WARMUP: "1",
           sdk.ENV_OPTIONS: json.dumps({"seconds_per_epoch": 0.4, "iters_per_epoch": 4,
                                        "busy_fraction": 0.5}),
           sdk.ENV_EPOCHS: "100"}
    subprocess.run([sys.executable, "-m", "hypersack.runner.sleep"], env=env, check=True,
                   timeout=60, capture_output=True)
    result = json.loads((tmp_path / "p.json").read_text())
    cpu_s = result["cpu_cores"] * result["iter_time_mean_s"] * result["iterations"]
    assert cpu_s >= 0.95 * 5 * 0.05 and result["iter_time_s"] >= 0.099


def test_settings_flags_beat_environment_beat_file(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "server.yaml"
    cfg.write_text("listen: 0.0.0.0:6000\nheartbeat_timeout_s: 9\nretries: 5\n")
    monkeypatch.setenv("HYPERSACK_HEARTBEAT_TIMEOUT_S", "12")
    s = load_settings(ServerSettings, {"retries": 1, "listen": None}, cfg)
    assert (s.listen, s.heartbeat_timeout_s, s.retries) == ("0.0.0.0:6000", 12.0, 1)
    cfg.write_text("lisen: x\n")
    with pytest.raises(InvalidInput, match=r"unknown setting.*lisen"):
        load_settings(ServerSettings, {}, cfg)
    with pytest.raises(InvalidInput, match="heartbeat_timeout_s"):
        load_settings(ServerSettings, {"heartbeat_timeout_s": -1})
    monkeypatch.setenv("HYPERSACK_SERVER", "head:7000")
    assert load_settings(AgentSettings, {}).server == "head:7000"
    # One architecture under two names (from flags or the file): one would apply to no GPU.
    cfg.write_text("oversubscription: {A100: 3, A100-80GB: 2}\n")
    with pytest.raises(InvalidInput, match="ratios for both 'A100-80GB' and 'A100'"):
        load_settings(ServerSettings, {}, cfg)
    cfg.write_text("oversubscription: {A100: 3, L40S: 2}\n")
    assert load_settings(ServerSettings, {}, cfg).oversubscription == {"A100": 3, "L40S": 2}


CHATTY = """
import sys, time
for i in range(400):
    sys.stdout.write(f"line {i:05d} " + "x" * 10_000 + "\\n")
    sys.stdout.flush()
    time.sleep(0.002)
print("THE END")
"""


def test_a_chatty_trial_keeps_its_log_under_the_cap_and_its_tail(tmp_path: Path) -> None:
    cap = 1 << 20  # 4 MB of output against a 1 MiB cap
    job = Job("t3", 0, tmp_path / "t3", [sys.executable, "-c", CHATTY], {}, log_max_bytes=cap)
    job.start()
    on_disk, rotations = 0, 0
    while job.poll() is None:
        rotations += job.cap_log()
        on_disk = max(on_disk, sum(p.stat().st_size for p in (job.log_path, job.kept_log_path)
                                   if p.exists()))
    rotations += job.cap_log()
    assert job.exit_code == 0 and rotations >= 3
    # The cap holds up to what the trial writes between two checks (here a few lines).
    assert on_disk <= cap + 200_000
    tail = job.log_tail(30_000)
    assert tail.rstrip().endswith("THE END") and "line 00399" in tail
    kept = job.kept_log_path.read_text()
    assert kept.startswith("[hypersack: the log passed 524288 bytes;")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="switching users needs root and util-linux's setpriv")
def test_a_trial_switched_to_its_user_by_setpriv_still_dies_with_the_agent() -> None:
    # The user switch happens in the exec'd wrapper (Popen's user= forks without vfork,
    # and a forked copy of a gRPC process crashed now and then); the parent-death signal
    # must survive it: a change of user clears the signal unless it is set afterwards.
    import pwd
    import signal
    import time

    import psutil

    from hypersack.agent.procs import die_with_parent

    nobody = pwd.getpwnam("nobody")
    argv = die_with_parent(["sleep", "60"], (nobody.pw_uid, nobody.pw_gid, []))
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; "
         f"p = subprocess.Popen({argv!r}); print(p.pid, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    proc = psutil.Process(int(parent.stdout.readline()))
    deadline = time.monotonic() + 10
    while proc.username() != "nobody" and time.monotonic() < deadline:
        time.sleep(0.05)  # setpriv execs sleep as nobody
    assert proc.username() == "nobody" and proc.uids().real == nobody.pw_uid
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE


def test_an_nvml_agent_takes_only_the_gpus_its_batch_system_gave() -> None:
    from hypersack.agent.nvml import visible
    from hypersack.core.types import GpuSpec
    gpus = tuple(GpuSpec(index=i, arch="A100", memory_mib=81920, uuid=f"GPU-{i}aa{i}")
                 for i in range(4))
    assert visible(gpus, None) == gpus
    assert visible(gpus, "") == ()
    assert [g.index for g in visible(gpus, "2,0")] == [2, 0]  # Slurm: --gres=gpu:2
    assert [g.index for g in visible(gpus, "GPU-3aa3, GPU-1")] == [3, 1]  # UUID prefixes
    assert [g.index for g in visible(gpus, "1,7,2")] == [1]  # CUDA stops at a bad entry
    assert visible(gpus, "GPU-") == ()  # ambiguous prefix
    assert [g.index for g in visible(gpus, "0,0")] == [0]


def test_a_pruned_trials_checkpoint_is_deleted_and_nothing_outside_it(tmp_path: Path) -> None:
    import queue

    from hypersack._proto.v1 import hypersack_pb2 as pb
    from hypersack.agent.agent import Agent
    from hypersack.agent.launcher import job_dir

    agent = Agent("127.0.0.1:1", "n1", FakeBackend("1xA100-80GB@4", node="n1"),
                  tmp_path / "work")
    kept = job_dir(agent.node_dir, "s-1", "s-1-t00000") / "checkpoint"
    pruned = job_dir(agent.node_dir, "s-1", "s-1-t00001") / "checkpoint"
    for folder in (kept, pruned):
        folder.mkdir(parents=True)
        (folder / "state.npz").write_bytes(b"weights")
    (pruned.parent / "log.txt").write_text("its log stays")
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "checkpoint").mkdir()
    outbox: queue.Queue[pb.AgentMessage | None] = queue.Queue()
    for study, trial in (("s-1", "s-1-t00001"), ("..", "../../precious"),
                         ("s-1", "s-1-t00009")):  # the last has none: nothing to do
        agent._command(pb.ServerMessage(drop_checkpoint=pb.DropCheckpoint(
            trial_id=trial, study_id=study)), outbox)
    assert not pruned.exists() and (pruned.parent / "log.txt").exists()
    assert (kept / "state.npz").exists()
    assert (outside / "checkpoint").is_dir()  # a hostile name stays inside the work dir
    assert outbox.empty()


def test_checkpoints_can_live_in_a_folder_every_node_sees(tmp_path: Path) -> None:
    import queue

    from hypersack._proto.v1 import hypersack_pb2 as pb
    from hypersack.agent.agent import Agent

    shared = tmp_path / "shared"
    agents = [Agent("127.0.0.1:1", n, FakeBackend("1xA100-80GB@4", node=n),
                    tmp_path / "work", checkpoints=shared) for n in ("n1", "n2")]
    launch = pb.LaunchTrial(trial_id="s-1-t00003", study_id="s-1", stop_at_epoch=3)
    # Paused on n1, resumed on n2: both name the same folder.
    folder = Path(agents[0].checkpoints.rung_env(launch)["HYPERSACK_CHECKPOINT_DIR"])
    assert folder == Path(agents[1].checkpoints.rung_env(launch)["HYPERSACK_CHECKPOINT_DIR"])
    assert shared.resolve() in folder.parents
    folder.mkdir(parents=True, exist_ok=True)  # the attempt's folder exists from the start
    agents[1]._command(pb.ServerMessage(drop_checkpoint=pb.DropCheckpoint(
        trial_id="s-1-t00003", study_id="s-1")), queue.Queue())
    assert not folder.exists()


class TestFakeBackendKeepsTheContract(DeviceBackendContract):
    def make_backend(self) -> DeviceBackend:
        return FakeBackend("2xH100-80GB@32", node="n1")


class TestCpuBackendKeepsTheContract(DeviceBackendContract):
    def make_backend(self) -> DeviceBackend:
        return CpuBackend()


def test_each_attempt_checkpoints_in_its_own_folder_from_the_newest_earlier_one(
        tmp_path: Path) -> None:
    from hypersack.agent.agent import Agent

    agent = Agent("127.0.0.1:1", "n1", FakeBackend("1xA100-80GB@4", node="n1"),
                  tmp_path / "work")
    first = agent.checkpoints.attempt("s-1", "s-1-t00000", 1)
    assert first.name == "attempt-1" and list(first.iterdir()) == []  # nothing to resume
    (first / "checkpoint.json").write_text('{"epoch": 3}')
    (first / "checkpoint.json.tmp").write_text("half written")
    third = agent.checkpoints.attempt("s-1", "s-1-t00000", 3)  # attempt 2 never saved
    assert sorted(p.name for p in third.iterdir()) == ["checkpoint.json"]
    (third / "checkpoint.json").write_text('{"epoch": 6}')
    assert (first / "checkpoint.json").read_text() == '{"epoch": 3}'  # its own, untouched
    fourth = agent.checkpoints.attempt("s-1", "s-1-t00000", 4)
    assert (fourth / "checkpoint.json").read_text() == '{"epoch": 6}'  # the newest
    assert agent.checkpoints.attempt("s-1", "s-1-t00000", 4) == fourth  # made once


def test_a_profiles_compute_share_is_read_over_its_timed_iterations_only() -> None:
    """A short profile run is mostly its process's start (imports, a CUDA context, the
    data) with the GPU idle; its share is the device's use while its timed iterations
    ran (a ResNet-34 that keeps an H100 busy was profiled at 6 % over the whole run)."""
    from hypersack.agent.devices import WINDOW_GRACE_S, busy_share

    start = [(100.0 + 0.05 * i, 0.0) for i in range(140)]  # 7 s of start-up, idle
    timed = [(107.0 + 0.05 * i, 95.0) for i in range(1, 9)]  # 0.4 s of iterations
    after = [(107.4 + 0.05 * i, 0.0) for i in range(6, 20)]  # exit, past NVML's period
    samples = start + timed + after
    assert busy_share(samples, None) < 10  # the whole run's mean: what went wrong
    assert busy_share(samples, (107.0, 107.4)) == pytest.approx(95.0)
    # NVML's reading just after the window still tells of it.
    assert busy_share([(106.9, 0.0), (107.4 + WINDOW_GRACE_S / 2, 80.0)],
                      (107.0, 107.3)) == 80.0
    # A window between two samples: the first one after it began.
    assert busy_share([(106.0, 0.0), (108.0, 70.0), (109.0, 10.0)], (107.0, 107.01)) == 70.0
    assert busy_share([], (1.0, 2.0)) is None


@pytest.mark.parametrize("value", [None, "1,2", [1.0], [1, 2, 3], ["a", 2], [2.0, 1.0],
                                   [float("nan"), 2.0], [1.0, float("inf")], {"a": 1},
                                   [0.0, 5.0], [500.0, 600.0]])
def test_a_hostile_profile_window_is_ignored(value: object) -> None:
    """The window is the trial's own output: anything but two ordered, finite numbers
    inside the process's life is no window (the whole run is measured instead)."""
    from hypersack.agent.devices import profile_window

    assert profile_window(value, (10.0, 20.0)) is None


def test_a_profile_window_is_cut_to_the_process_life() -> None:
    from hypersack.agent.devices import profile_window

    assert profile_window([12, 15], (10.0, 20.0)) == (12.0, 15.0)
    assert profile_window([5.0, 15.0], (10.0, 20.0)) == (10.0, 15.0)
    assert profile_window([15.0, 99.0], (10.0, 20.0)) == (15.0, 20.0)


def test_the_nvml_backend_measures_a_profile_over_its_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Wired end to end through a stand-in for pynvml: the device is idle for the
    profile process's first 0.5 s (its start) and busy after; the demand is the busy
    share, not the run's mean."""
    import time
    import types

    from hypersack.agent.nvml import NvmlBackend

    t0 = time.time()
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: "GPU-0000",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 * 2**30, used=0),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(
            gpu=90 if time.time() >= t0 + 0.5 else 0),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=1, usedGpuMemory=512 * 2**20)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    backend = NvmlBackend()
    (device,) = backend.devices()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.2)"])
    backend.start_measuring(device, proc.pid)
    proc.wait(timeout=30)
    time.sleep(0.1)
    compute, memory, _ = backend.demand(device, Measured(1.0, 10.0, window=(t0 + 0.6, t0 + 1.0)))
    assert compute == pytest.approx(90.0) and memory == 512


@pytest.mark.parametrize("mps_samples", ["none", "zeros", "server"])
def test_under_mps_a_trial_alone_on_its_gpu_is_seen_using_the_devices_compute(
        monkeypatch: pytest.MonkeyPatch, mps_samples: str) -> None:
    """NVML keeps no per-process utilization for MPS clients: it either has no samples
    or (as on an H100, driver 580) samples of 0 % for each client while the device is
    busy. A trial alone on its GPU is then seen at the device's, so a profile that read
    too low can be corrected; two trials on one GPU cannot be told apart, and are not
    guessed at; and without MPS, a process of someone else's that keeps the GPU busy
    is not taken for the trial's use."""
    import types

    from hypersack.agent.nvml import NvmlBackend

    def samples(h: int, last: int) -> list[object]:
        if h == 2:  # no MPS: the trial idle, a stranger's process busy
            return [types.SimpleNamespace(pid=31, smUtil=0, timeStamp=5),
                    types.SimpleNamespace(pid=99, smUtil=70, timeStamp=5)]
        if mps_samples == "none":
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        if mps_samples == "server":
            return [types.SimpleNamespace(pid=7, smUtil=90, timeStamp=5)]
        return [types.SimpleNamespace(pid=pid, smUtil=0, timeStamp=5)
                for pid in ((11,), (21, 22))[h]]

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 3,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=80 * 2**30, used=0),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=(88, 97, 70)[h]),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=pid, usedGpuMemory=1024 * 2**20)
            for pid in ((11,), (21, 22), (31, 99))[h]],
        nvmlDeviceGetProcessUtilization=samples)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr("hypersack.agent.nvml.process_name",
                        lambda pid: {7: "nvidia-cuda-mps-server"}.get(pid, "python3"))
    backend = NvmlBackend()
    gpu0, gpu1, gpu2 = backend.devices()
    seen = backend.observe({"alone": (gpu0, [11]), "a": (gpu1, [21]), "b": (gpu1, [22]),
                            "idle": (gpu2, [31])})
    assert seen["alone"].utilization_pct == 88.0 and seen["alone"].memory_mib == 1024
    assert seen["a"].utilization_pct == seen["b"].utilization_pct == 0.0
    assert seen["idle"].utilization_pct == 0.0


def test_the_node_s_trial_trees_come_from_one_scan_of_proc(tmp_path: Path) -> None:
    """Sampling what trials use needs each trial's process tree; asked one trial at a
    time, each scanned /proc whole (16 trials: 19 ms on the agent's command thread, once
    a second, in the way of launches). One scan serves them all, finds the same trees,
    and a descendant found so is remembered, so that the trial's kill reaches it."""
    from unittest.mock import patch

    from hypersack.agent import agent as agent_module
    from hypersack.agent.agent import Agent
    from hypersack.agent.devices import Usage
    from hypersack.agent.procs import children_map, tree, tree_pids

    agent = Agent("127.0.0.1:1", "n1", CpuBackend(), tmp_path / "work")
    jobs = []
    for i in range(3):  # each a shell whose child sleeps: a tree of two
        job = Job(f"t{i}", 0, tmp_path / f"t{i}", ["sh", "-c", "sleep 60 & wait"], {})
        job.start()
        jobs.append(job)
        agent.jobs[job.key] = job
    try:
        for job in jobs:
            assert job.proc is not None
            wait_for_children(job.proc.pid)
        children = children_map()
        for job in jobs:
            assert job.proc is not None
            assert sorted(tree_pids(job.proc.pid, children)) == \
                sorted(p.pid for p in tree(job.proc.pid))
        assert tree_pids(2**22 + 7, children) == []  # gone: nothing
        scans: list[int] = []
        real = agent_module.children_map
        seen: dict[str, list[int]] = {}

        def observe(found: dict[str, tuple[object, list[int]]]) -> dict[str, Usage]:
            seen.update({k: v[1] for k, v in found.items()})
            return {}

        with patch.object(agent_module, "children_map",
                          lambda: scans.append(1) or real()), \
                patch("hypersack.agent.procs.psutil.Process.children",
                      side_effect=AssertionError("a scan per trial")), \
                patch.object(agent.backend, "observe", observe):
            agent._observe()
        assert scans == [1] and len(seen) == 3 and all(len(p) == 2 for p in seen.values())
        for job in jobs:  # remembered: the trial's kill signals them, even reparented
            assert {p.pid for p in job._tree} == set(seen[job.key])
    finally:
        for job in jobs:
            job.kill()
            if job.proc is not None:
                job.proc.wait(10)


def wait_for_children(pid: int) -> None:
    import psutil

    deadline = time.monotonic() + 10
    while not psutil.Process(pid).children() and time.monotonic() < deadline:
        time.sleep(0.02)
