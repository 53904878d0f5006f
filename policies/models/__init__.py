"""Built-in models; importing this package registers them."""

from policies.models import mlp  # noqa: F401
from policies.models import cnn  # noqa: F401
from policies.models import token_policy  # noqa: F401
from policies.vla import factory  # noqa: F401  (openvla, openvla_oft; their heavy imports are lazy)
from policies.pi0 import factory as pi0_factory  # noqa: F401  (pi0, pi05; their heavy imports are lazy)
from policies.lm import options as causal_lm  # noqa: F401  (registers causal_lm; transformers loads on build)
