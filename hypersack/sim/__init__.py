"""The simulator: the real orchestrator on a virtual clock with simulated agents."""
