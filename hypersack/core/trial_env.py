"""The contract between an agent and the trial process it starts: the environment
variables it sets and the exit code that means out-of-memory. The agent and the server
read them here; the trial side (`hypersack.runner.sdk`) uses the same names."""

from __future__ import annotations

ENV_TRIAL_ID = "HYPERSACK_TRIAL_ID"
ENV_STUDY_ID = "HYPERSACK_STUDY_ID"
ENV_ATTEMPT = "HYPERSACK_ATTEMPT"  # the launch this process runs: 1 for the first
ENV_PARAMS = "HYPERSACK_PARAMS"
ENV_EPOCHS = "HYPERSACK_EPOCHS"
ENV_OPTIONS = "HYPERSACK_PROGRAM_OPTIONS"
ENV_METRICS = "HYPERSACK_METRICS_FILE"
ENV_PROFILE = "HYPERSACK_PROFILE_FILE"
# The same channels as inherited descriptors (what the agent gives; the SDK prefers them).
ENV_METRICS_FD = "HYPERSACK_METRICS_FD"
ENV_PROFILE_FD = "HYPERSACK_PROFILE_FD"
ENV_PROFILE_ITERATIONS = "HYPERSACK_PROFILE_ITERATIONS"
ENV_PROFILE_WARMUP = "HYPERSACK_PROFILE_WARMUP"
ENV_FUSED = "HYPERSACK_FUSED"  # a fused group's members (hypersack.runner.fused_train)
# Early stopping: the folder a trial keeps its checkpoint in (the same for every attempt
# of the trial on a node), and the epoch this attempt stops at to be ranked (unset: its
# last epoch).
ENV_CHECKPOINT_DIR = "HYPERSACK_CHECKPOINT_DIR"
ENV_STOP_AT_EPOCH = "HYPERSACK_STOP_AT_EPOCH"
OOM_EXIT_CODE = 86


def as_text(value: object) -> str:
    """A value as a program's argument (and in a workload key): a whole float is written
    as an integer (`6`, not `6.0`, which `int()` and argparse's `type=int` refuse);
    others as Python writes them."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return str(value)


def epoch_count(value: float, limit: float = 1_000_000.0) -> float:
    """An epoch count from a message: finite, 0 to `limit`; anything else is 0 (unset)."""
    return value if isinstance(value, float) and 0.0 <= value <= limit else 0.0
