"""A fused group end to end: a real server and agent, four ResNet-18 trials that differ
only in their learning rate train in one process (the example profiles' fused widths
make width 4 the cheapest), each reported as its own trial; the one whose learning rate
blows up ends DIVERGED while the other three complete."""

from __future__ import annotations

import pytest

from hypersack.testing.cluster import Cluster
from hypersack.testing.cluster import done as _done
from hypersack.testing.cluster import submit as _submit

pytest.importorskip("torch")

SPACE = """
name: fused
models: [resnet18]
hyperparameters:
  batch_size: [64]
  lr: [0.05, 0.02, 1.0e+30, 0.01]
settings: {epochs: 1, retries: 0}
program: {builtin: train, options: {dataset: synthetic, train_samples: 64, val_samples: 16}}
"""


def test_four_trials_train_as_one_fused_group_and_end_on_their_own(cluster: Cluster) -> None:
    cluster.start_server()
    cluster.start_agent("n1", "1xA100-80GB@48")
    study = _submit(cluster, SPACE)
    trials = _done(cluster, study, 240)
    assert {t.fused_group for t in trials} != {""}, [t.reason for t in trials]
    assert len({t.fused_group for t in trials}) == 1 and {t.fusion_width for t in trials} == {4}
    states = {t.params_json: t.state for t in trials}
    assert sorted(states.values()) == ["COMPLETED", "COMPLETED", "COMPLETED", "DIVERGED"], \
        [t.log_tail for t in trials]
    diverged = next(t for t in trials if t.state == "DIVERGED")
    assert "1e+30" in diverged.params_json
    for t in trials:
        if t.state == "COMPLETED":
            assert 0 <= t.metrics["accuracy"] <= 1 and t.metrics["epoch"] == 1
    # One process trained them: its log names the fused trainer.
    assert "hypersack.runner.fused_train" in trials[0].log_tail


ASHA = """
name: fused-asha
models: [resnet18]
hyperparameters:
  batch_size: [64]
  lr: [0.05, 0.02, 0.1, 0.01]
pruner: {type: asha, min_epochs: 1, reduction_factor: 2, promotion_window_s: 1}
settings: {epochs: 4, retries: 0, fusion: "on"}
program: {builtin: train, options: {dataset: synthetic, train_samples: 64, val_samples: 16}}
"""


def test_a_fused_rung_pauses_together_and_promotions_resume_from_checkpoints(
        cluster: Cluster) -> None:
    """ASHA with fusion: the four trials train fused to rung 1 and pause there, each
    with its own checkpoint; the two promoted resume fused from theirs to rung 2; the
    last one goes on alone, the plain trainer resuming from the fused trainer's
    checkpoint."""
    cluster.start_server()
    cluster.start_agent("n1", "1xA100-80GB@48")
    study = _submit(cluster, ASHA)
    trials = _done(cluster, study, 300)
    states = sorted(t.state for t in trials)
    assert states == ["COMPLETED", "PRUNED", "PRUNED", "PRUNED"], \
        [(t.id, t.state, t.reason) for t in trials]
    done = next(t for t in trials if t.state == "COMPLETED")
    assert done.metrics["epoch"] == 4
    logs = cluster.logs("n1")
    assert "fused group" in logs
    work = cluster.tmp / "work"
    texts = {p: p.read_text() for p in work.rglob("log.txt")}
    assert any("paused at epoch 1: checkpoints saved" in t for t in texts.values())
    assert any("resumed 2 members from their checkpoints after epoch 1" in t
               for t in texts.values()), list(texts.values())
    # The completed trial's last attempt ran alone, from the fused checkpoint.
    assert any("resumed from" in t and "after epoch 2" in t for t in texts.values())
