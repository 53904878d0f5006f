"""An env that hangs in an env worker of the in-process backend is reported at the env (its id,
index and seed, ``env.timeout_s``), as an env process of the multiprocess backend is, not at the
rollout worker that waits for its observations."""

from __future__ import annotations

import pytest

from tests.faults.test_env_faults import ENV, assert_clean_end, injected

pytestmark = pytest.mark.slow


def test_an_env_that_hangs_in_an_env_worker_is_named_with_env_timeout_s(start, tmp_path):
    run = injected(start, tmp_path, "hang_step", "env.backend=inprocess", "env.timeout_s=2", "cluster.timeout_s=60")
    text = assert_clean_end(run, 5)
    assert text.startswith(f"embodied: error: Timed out (exit code 5): {ENV} did not return within 2 s (env.timeout_s) "
                           "while stepping (step())"), text
    assert "worker group env, rank 0" in text and "cluster.timeout_s" not in text, text
    log = (tmp_path / "run" / "logs" / "env-0.log").read_text()
    assert "faulty_env.py" in log and "in step" in log, log[-2000:]  # the hung thread's Python stack
