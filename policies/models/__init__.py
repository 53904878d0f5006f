"""Built-in models; importing this package registers them."""

from policies.models import mlp  # noqa: F401
from policies.models import cnn  # noqa: F401
from policies.models import token_policy  # noqa: F401
from policies.vla import factory  # noqa: F401  (openvla, openvla_oft; their heavy imports are lazy)
