"""HyperSack: resource-aware GPU scheduling for hyperparameter search."""

__version__ = "0.1.0"
