"""Generation: jitted prefill + while-loop decode with a KV cache."""

from jaxrlhf.rollout.sampler import SamplingParams, filter_logits, generate, token_log_probs

__all__ = ["SamplingParams", "filter_logits", "generate", "token_log_probs"]
