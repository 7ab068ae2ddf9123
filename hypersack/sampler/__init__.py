"""Demands per (workload, GPU architecture): the profile history and profile files."""
