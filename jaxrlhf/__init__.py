"""jaxrlhf: verl's PPO trainer for RLHF, reimplemented in JAX/XLA as one compiled PPO step."""

__version__ = "0.1.0"
