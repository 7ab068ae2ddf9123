"""Failure handling: what happens to a trial whose attempt failed or ran out of memory.
Pure decisions; the orchestrator applies them."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class AfterFailure:
    give_up: bool  # FAILED for good; otherwise PENDING for another attempt
    failures: int
    reason: str


def after_failure(exit_code: int, failures_before: int, retries: int) -> AfterFailure:
    """A failed attempt is retried while failures stay within the study's retries."""
    failures = failures_before + 1
    if failures > retries:
        return AfterFailure(True, failures, f"exit code {exit_code}; failed {failures} times "
                                            f"(retries: {retries})")
    return AfterFailure(False, failures, f"exit code {exit_code}; retry {failures} of {retries}")


@dataclass(frozen=True)
class AfterOutOfMemory:
    give_up: bool  # no GPU has the memory it now asks for
    memory_mib: int  # what the trial asks for from now on
    reason: str


def after_out_of_memory(held_mib: int, observed_mib: int, growth: float, largest_mib: int
                        ) -> AfterOutOfMemory:
    """An out-of-memory death is no failure of the trial: it asks for more memory (by the
    growth factor, and more than it was seen using) and runs again, unless that is more
    than any GPU has."""
    grown = max(math.ceil(held_mib * growth), observed_mib + 1)
    if grown > largest_mib:
        return AfterOutOfMemory(True, grown, f"out of memory: needs more than {held_mib} MiB, "
                                             f"grown to {grown} MiB, larger than any GPU "
                                             f"({largest_mib} MiB)")
    return AfterOutOfMemory(False, grown, f"out of memory at {held_mib} MiB; now asks "
                                          f"{grown} MiB")
