"""HyperSack: resource-aware GPU scheduling for hyperparameter search."""

from hypersack.runner.sdk import report

__version__ = "0.1.0"
__all__ = ["__version__", "report"]
