"""Built-in env adapters; importing this package registers them."""

from envs.adapters import gymnasium_adapter  # noqa: F401
