"""Training processes: built-in workloads and the metrics SDK a trial program uses.

Only this package imports torch, and only in the modules that train zoo models; the
SDK and the pure-Python workloads import nothing heavy.
"""

from __future__ import annotations

from hypersack.core.catalog import MODELS


def builtin_trainable() -> frozenset[str]:
    """Models the built-in `train` program can train in this installation."""
    return frozenset(name for name, info in MODELS.items() if not info.needs_torch)
