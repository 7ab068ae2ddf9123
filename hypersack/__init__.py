"""HyperSack: resource-aware GPU scheduling for hyperparameter search."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Client", "Results", "Study", "Trial", "__version__", "checkpoint_dir", "report",
           "should_stop"]
_SDK = ("report", "checkpoint_dir", "should_stop")


def __getattr__(name: str) -> Any:
    # Loaded on first use: `hypersack.report` is the trial side's, `hypersack.Client`
    # the Python API's; importing the package for the server or the agent loads neither.
    if name in _SDK:
        from hypersack.runner import sdk

        return getattr(sdk, name)
    if name in ("Client", "Results", "Study", "Trial"):
        from hypersack.cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'hypersack' has no attribute {name!r}")
