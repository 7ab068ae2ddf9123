"""The contract between an agent and the trial process it starts: the environment
variables it sets and the exit code that means out-of-memory. The agent and the server
read them here; the trial side (`hypersack.runner.sdk`) uses the same names."""

from __future__ import annotations

ENV_TRIAL_ID = "HYPERSACK_TRIAL_ID"
ENV_STUDY_ID = "HYPERSACK_STUDY_ID"
ENV_PARAMS = "HYPERSACK_PARAMS"
ENV_EPOCHS = "HYPERSACK_EPOCHS"
ENV_OPTIONS = "HYPERSACK_PROGRAM_OPTIONS"
ENV_METRICS = "HYPERSACK_METRICS_FILE"
ENV_PROFILE = "HYPERSACK_PROFILE_FILE"
ENV_PROFILE_ITERATIONS = "HYPERSACK_PROFILE_ITERATIONS"
ENV_PROFILE_WARMUP = "HYPERSACK_PROFILE_WARMUP"
ENV_FUSED = "HYPERSACK_FUSED"  # a fused group's members (hypersack.runner.fused_train)
OOM_EXIT_CODE = 86


def as_text(value: object) -> str:
    """A value as a program's argument (and in a workload key): a whole float is written
    as an integer (`6`, not `6.0`, which `int()` and argparse's `type=int` refuse);
    others as Python writes them."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return str(value)
