"""Benchmarks: ``python -m benchmarks.<name>``; results in ``benchmarks/results/``."""

from embodied.runtime.cluster import apply_torch_process_env

apply_torch_process_env()  # as the `embodied` CLI does, before any benchmark loads torch
