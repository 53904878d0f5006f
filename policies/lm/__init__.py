"""Causal language models as token-level policies (reasoning RL).

* :mod:`policies.lm.options`: ``policy.kwargs`` of ``causal_lm`` and its registration (no transformers import);
* :mod:`policies.lm.policy`: :class:`~policies.lm.policy.CausalLMPolicy` (act / evaluate / encode / decode);
* :mod:`policies.lm.sampling`: the processed sampling distribution, EOS masks, left-padding positions;
* :mod:`policies.lm.tiny`: tiny Qwen2 models with a byte-level tokenizer, written with ``save_pretrained``.
"""
