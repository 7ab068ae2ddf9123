"""HyperSack: resource-aware GPU scheduling for hyperparameter search."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "report"]


def __getattr__(name: str) -> Any:
    # `hypersack.report` is the trial side's; importing the package for the server, the
    # agent or the CLI does not load it.
    if name == "report":
        from hypersack.runner.sdk import report

        return report
    raise AttributeError(f"module 'hypersack' has no attribute {name!r}")
