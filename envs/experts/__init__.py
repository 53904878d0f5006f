"""Scripted experts: demonstrators that read a simulator's privileged state (see :mod:`envs.experts.maniskill`)."""
