"""Profiling probes of the embodied workflow (see :mod:`pipelines.probes.env`)."""

from pipelines.probes.env import *  # noqa: F401,F403
