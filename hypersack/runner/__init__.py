"""Training processes: built-in workloads and the metrics SDK a trial program uses.

Only this package imports torch, and only in the modules that train zoo models
(`zoo`, `torch_train`); the SDK, the options, the datasets and the NumPy and sleep
workloads import nothing heavy, so the server can check a study's options.
"""
