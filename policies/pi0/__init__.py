"""π0 and π0.5 built from transformers' PaliGemma and Gemma, trained with πRL's Flow-SDE / Flow-Noise.

Modules: ``config`` (sizes), ``model`` (the shared-attention network), ``inputs`` (images,
prompts, statistics), ``loader`` (LeRobot / openpi checkpoints), ``tiny`` (tiny models and
checkpoints), ``policy`` (the Policy contract) and ``factory`` (registration; light). docs/pi0.md.
"""
