"""Built-in env adapters; importing this package registers them."""

from envs.adapters import gymnasium_adapter  # noqa: F401
from envs.adapters import batched_adapter  # noqa: F401
from envs.adapters import robosuite_adapter  # noqa: F401
from envs.adapters import libero_adapter  # noqa: F401
from envs.adapters import maniskill_adapter  # noqa: F401
from envs.adapters import color_reach  # noqa: F401
from envs.adapters import mjx_adapter  # noqa: F401
from envs.adapters import metaworld_adapter  # noqa: F401
