"""jaxrlhf: verl's PPO trainer for RLHF, reimplemented in JAX/XLA as one compiled PPO step."""

import os

# transformers prints "PyTorch was not found. Models won't be available..." when it is imported without torch: true,
# and no concern of a JAX trainer that uses it for tokenizers and configs only, but it reads as a failure at the top of
# every command. It is an advisory warning, which this variable turns off (a user's own setting wins).
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

__version__ = "0.1.0"
