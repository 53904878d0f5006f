"""``python -m benchmarks.m2flow_sweep``: see :mod:`benchmarks.m2flow_sweep`."""

from benchmarks.m2flow_sweep import main

if __name__ == "__main__":
    main()
