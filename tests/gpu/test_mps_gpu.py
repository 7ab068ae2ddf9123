"""MPS against the real `nvidia-cuda-mps-control` on a real GPU (marked `gpu`; skipped
where there is none)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hypersack.agent.mps import MPS, TIME_SLICING, MpsControl

pytestmark = pytest.mark.gpu


def _gpus() -> list:  # type: ignore[type-arg]
    try:
        from hypersack.agent.nvml import NvmlBackend
        return NvmlBackend().devices()
    except Exception:
        return []


@pytest.fixture
def devices() -> list:  # type: ignore[type-arg]
    found = _gpus()
    if not found or shutil.which("nvidia-cuda-mps-control") is None:
        pytest.skip("needs an NVIDIA GPU and nvidia-cuda-mps-control")
    return found


def test_real_daemons_start_answer_and_stop(tmp_path: Path, devices: list) -> None:  # type: ignore[type-arg]
    mps = MpsControl(tmp_path / "node", devices)
    mps.start()
    try:
        assert all(mps.mode(d.index)[0] == MPS for d in devices)
        assert all(mps.alive(mps.gpus[d.index]) for d in devices)
    finally:
        mps.stop()
    assert all(mps.mode(d.index)[0] == TIME_SLICING for d in devices)
    assert not any(mps.alive(mps.gpus[d.index]) for d in devices)
