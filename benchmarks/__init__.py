"""Benchmarks, one per question: ``python -m benchmarks.<name>`` (``--help`` says what each measures).

Each writes its result to ``benchmarks/results/<name>[_<variant>].json`` with the command, the
machine and the commit it ran on (:mod:`benchmarks.common`; ``--name``/``--out`` write it elsewhere);
docs/benchmarks.md quotes them. A run's learning curve is ``embodied plot RUN_DIR``.
"""

from embodied.runtime.cluster import apply_torch_process_env

apply_torch_process_env()  # as the `embodied` CLI does, before any benchmark loads torch
