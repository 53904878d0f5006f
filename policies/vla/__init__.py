"""OpenVLA and OpenVLA-OFT built from transformers' native classes (no timm, no remote code).

Modules: ``config`` (config.json), ``vision`` (towers, projector), ``model`` (OpenVLA),
``oft`` (parallel decoding), ``heads`` (value, L1, proprio), ``actions`` (tokens, normalization),
``processor`` (images, prompts), ``sampling`` (the processed distribution), ``keymap`` and
``loader`` (official checkpoints), ``lora``, ``tiny`` (tiny checkpoints), ``policy`` (the Policy
contract) and ``factory`` (registration; light, imported by ``policies.models``). See docs/vla.md.
"""
