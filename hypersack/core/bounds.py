"""Validated field types: every number that crosses a boundary (a file, a flag, a protobuf
message) is finite and inside these bounds before it reaches the core.

The bounds are far above any real cluster and far below what breaks arithmetic: the
policies add demands in integer units, the protocol carries int32 and int64 fields, and
a search space is sized before it is expanded.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, TypeGuard

from pydantic import Field

from hypersack.core.errors import InvalidInput

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

MAX_COMPUTE_PCT = 100_000.0  # one trial's compute demand: 1,000 GPUs' worth
MAX_MEMORY_MIB = 1 << 30  # one GPU or one demand: 1 PiB
MAX_CORES = 1_000_000.0  # one node
MAX_EPOCHS = 1_000_000.0
MAX_EXTEND = 100_000  # trials one `hypersack extend` adds
MIN_EPOCHS = 1.0e-6  # a fraction of an epoch is fine; 1e-300 is a typo
MAX_SECONDS = 1.0e9  # about 31 years: any duration, time stamp offset or timeout
MAX_TIMESTAMP_S = 1.0e11  # seconds since the Unix epoch (year 5138)
MAX_BATCH_SIZE = INT32_MAX
MAX_RATIO = 1_000.0  # oversubscription
# A trial's reported seconds per iteration above a day are not a measurement.
MAX_ITER_S = 86_400.0
MAX_PRIORITY = 1_000  # a study's priority lies in [-MAX_PRIORITY, MAX_PRIORITY]
MAX_WEIGHT = 1.0e6  # a study's or user's fair-share weight
MAX_GPUS_PER_NODE = 256
MAX_NODES = 10_000  # per cluster description and per server
MAX_FUSION_WIDTH = 1024
MAX_FUSED_MEMBERS = 64  # trials one fused process trains
MAX_NAME_CHARS = 128
MAX_TEXT_CHARS = 4096  # short free text in records (reasons, sources, versions)
MAX_FILE_BYTES = 16 << 20  # an input file (search space, cluster, profiles, settings)
MAX_YAML_DEPTH = 64

# Names people and programs choose (nodes, architectures, models, metrics): printable,
# no whitespace or markup-significant brackets at the start, no control characters.
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:@+=-]*$"
_NAME = re.compile(NAME_PATTERN)

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS, pattern=NAME_PATTERN)]
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
ComputePct = Annotated[float, Field(ge=0, le=MAX_COMPUTE_PCT, allow_inf_nan=False)]
MemoryMiB = Annotated[int, Field(ge=0, le=MAX_MEMORY_MIB)]
Cores = Annotated[float, Field(ge=0, le=MAX_CORES, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
Timestamp = Annotated[float, Field(ge=0, le=MAX_TIMESTAMP_S, allow_inf_nan=False)]
Epochs = Annotated[float, Field(ge=MIN_EPOCHS, le=MAX_EPOCHS, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Ratio = Annotated[float, Field(gt=0, le=MAX_RATIO, allow_inf_nan=False)]


def is_name(text: str) -> bool:
    return len(text) <= MAX_NAME_CHARS and _NAME.match(text) is not None


def finite(value: float, what: str, low: float, high: float) -> float:
    """`value` if it is a finite number in [low, high]; InvalidInput otherwise."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"{what}: {value!r} is not a number") from None
    if not math.isfinite(number) or not low <= number <= high:
        raise InvalidInput(f"{what}: {value!r} is not a finite number in [{low:g}, {high:g}]")
    return number


def is_number(value: object) -> TypeGuard[float]:
    """A finite int or float, not a bool (what a JSON document or a peer says); an int
    past a float's range is not one."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def iteration_timing(iter_s: object, window_s: object) -> tuple[float, float] | None:
    """A trial's reported seconds per iteration and the window they span, if both are
    measurements (positive numbers, at most MAX_ITER_S per iteration and a hundred times
    that for the window); None otherwise. The agent and the server both ask it."""
    if not is_number(iter_s) or not is_number(window_s):
        return None
    if not (0 < iter_s <= MAX_ITER_S and 0 < window_s <= 100 * MAX_ITER_S):
        return None
    return float(iter_s), float(window_s)


def clamp(value: float, low: float, high: float, default: float) -> float:
    """A measurement or hint from a peer: clamped into range, `default` if not finite."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return default
    if not math.isfinite(number):
        return default
    return min(high, max(low, number))
