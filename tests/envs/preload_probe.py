"""A module whose import appends this process's pid to the file named by PRELOAD_PROBE_FILE
(tests/envs/test_multiprocess.py: which processes import a preloaded module)."""

import os

with open(os.environ["PRELOAD_PROBE_FILE"], "a") as f:
    f.write(f"{os.getpid()}\n")
