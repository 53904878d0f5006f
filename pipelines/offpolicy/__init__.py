"""The off-policy workflow (``workflow: offpolicy``): env workers that act with a copy of the actor,
a trainer with a replay buffer, SAC or RLPD (``embodied/algorithms/sac.py``)."""
