"""`jetstream.engine.engine_api.Engine` over our `Engine`, for serving with JetStream's orchestrator.

JetStream (google-jetstream) pulls TensorFlow through seqio, so it is an optional extra, never a core
dependency: this module imports without it, and `JetStreamEngine(...)` then raises an ImportError
that says what to install.

    engine = Engine(model_config, sampling, max_concurrent_decodes=32)
    served = JetStreamEngine(engine, tokenizer_path="path/to/hf_checkpoint")
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrlhf.models import generation_eos_ids, load_tokenizer, pad_token_id
from jaxrlhf.rollout.engine import Engine, ResultTokens

try:  # the optional extra: guarded here, once, so that no function imports it lazily
  from jetstream.engine import engine_api as _engine_api
  from jetstream.engine import tokenizer_pb2 as _tokenizer_pb2
except ImportError:  # not installed
  _engine_api = _tokenizer_pb2 = None

INSTALL_HINT = "JetStreamEngine needs the optional `jetstream` extra: pip install google-jetstream"


def to_jetstream_result(result: ResultTokens):
  """Our ResultTokens (same layout) as JetStream's class; versions before `samples_per_slot` are accepted."""
  fields = dict(
    data=result.data, tokens_idx=result.tokens_idx, valid_idx=result.valid_idx, length_idx=result.length_idx
  )
  try:
    return _engine_api.ResultTokens(**fields, samples_per_slot=result.samples_per_slot)
  except TypeError:
    return _engine_api.ResultTokens(**fields)


class HFTokenizer:
  """JetStream's tokenizer interface (encode -> right-padded ids + true length, decode, pad_id, eos_id)."""

  def __init__(self, path: str):
    self.tokenizer = load_tokenizer(path)
    self.eos_ids = generation_eos_ids(path, self.tokenizer)
    self._pad_id = pad_token_id(self.tokenizer, self.eos_ids)

  def encode(self, s: str, **kwargs):
    ids = self.tokenizer(s, add_special_tokens=False)["input_ids"]
    buckets = kwargs.get("prefill_lengths")
    length = min((b for b in buckets or () if b >= len(ids)), default=len(ids))
    padded = np.full((length,), self._pad_id, np.int32)
    padded[: len(ids)] = ids[:length]
    return padded, min(len(ids), length)

  def decode(self, token_ids) -> str:
    return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

  @property
  def pad_id(self) -> int:
    return self._pad_id

  @property
  def eos_id(self) -> int:
    return self.eos_ids[0]


_Base: Any = _engine_api.Engine if _engine_api is not None else object


class JetStreamEngine(_Base):
  """Delegates every engine_api call to `engine`; results become JetStream's `ResultTokens`."""

  def __init__(self, engine: Engine, tokenizer_path: str | None = None):
    if _engine_api is None:
      raise ImportError(INSTALL_HINT)
    self.engine = engine
    self.tokenizer_path = tokenizer_path

  def prefill(self, *, params, existing_prefix=None, padded_tokens, true_length, sampler=None, **unused):
    prefix, result = self.engine.prefill(
      params=params,
      existing_prefix=existing_prefix,
      padded_tokens=padded_tokens,
      true_length=true_length,
      sampler=sampler,
    )
    return prefix, to_jetstream_result(result)

  def insert(self, prefix, decode_state, slot: int, **unused):
    return self.engine.insert(prefix, decode_state, slot)

  def generate(self, params, decode_state, sampler=None, **unused):
    decode_state, result = self.engine.generate(params, decode_state, sampler)
    return decode_state, to_jetstream_result(result)

  def free_resource(self, slot: int):
    return self.engine.free_resource(slot)

  def load_params(self, *args, **kwargs):
    return self.engine.load_params(*args, **kwargs)

  def get_prefix_destination_sharding(self):
    return self.engine.get_prefix_destination_sharding()

  def get_tokenizer(self):
    return _tokenizer_pb2.TokenizerParameters(path=self.tokenizer_path or "")

  def build_tokenizer(self, metadata):
    return HFTokenizer(metadata.path or self.tokenizer_path)

  def init_decode_state(self, *args, **kwargs):
    return self.engine.init_decode_state()

  @property
  def max_concurrent_decodes(self) -> int:
    return self.engine.max_concurrent_decodes

  @property
  def samples_per_slot(self) -> int:
    return self.engine.samples_per_slot

  @property
  def max_prefill_length(self) -> int:
    return self.engine.max_prefill_length

  @property
  def mesh(self):
    return self.engine.mesh

  @property
  def colocated_cpus(self):
    return self.engine.colocated_cpus
