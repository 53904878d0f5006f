"""The embodied on-policy workflow (PPO, GRPO): env workers, rollout workers and a trainer."""
