"""JetStream's engine and tokenizer API (google-jetstream) over our `Engine`, for JetStream's orchestrator.

    tokenizer = HFTokenizer.from_path("path/to/hf_checkpoint")
    engine = Engine(model_config, sampling, max_concurrent_decodes=8, prefill_buckets=(64, 256, 1024))
    served = JetStreamEngine(engine, tokenizer, params=params)
    driver = orchestrator.Driver(prefill_engines=[served], generate_engines=[served], ...)

`python -m jaxrlhf.serve` does this for a checkpoint and starts JetStream's gRPC server (docs/serving.md).

One adapter for both of JetStream's engine APIs, told apart by what `engine_api.Engine.prefill` returns:
- released (0.2.2): `prefill -> Prefix`, and the orchestrator never reports the token sampled at prefill. So
  `prefill` returns that token with the prefix (`PrefillResult`), `insert` holds it for the slot and the slot's
  next `generate` reports it: `generate` reports every slot's results one step late (`HeldDecodeState`), the
  first token included, the request's last token one step after the engine sampled it.
- later (the repository's last API): `prefill -> (Prefix, ResultTokens)`, which the orchestrator reports
  itself; `bulk_insert`, `prefill_multisampling`, `use_chunked_prefill` and `prefill_chunk_size` exist too.

Requests that cannot be served (an empty prompt or one longer than the engine's `max_prefill_length`) never
raise inside JetStream's threads, which kill the process on any exception: `prefill` logs the reason and
returns a finished prefix with no token, so that request ends empty and the others go on. `jaxrlhf.serve`
refuses such a request earlier, with a gRPC error that says why.

JetStream is an optional extra (`pip install -e '.[jetstream]'`; it pulls TensorFlow through seqio):
this module imports without it, and `JetStreamEngine` / `HFTokenizer` then raise an ImportError that says
what to install and what failed to import.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import typing
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxrlhf.models import generation_eos_ids, load_tokenizer, pad_token_id
from jaxrlhf.rollout.engine import DecodeState, Engine, Prefix, ResultTokens
from jaxrlhf.rollout.sampler import request_key

try:  # the optional extra: guarded here, once, so that no function imports it lazily
  from jetstream.engine import engine_api, token_utils, tokenizer_api, tokenizer_pb2

  _JETSTREAM_IMPORT_ERROR = None
except ImportError as e:  # not installed, or one of its imports (seqio, TensorFlow) missing
  engine_api = token_utils = tokenizer_api = tokenizer_pb2 = None
  _JETSTREAM_IMPORT_ERROR = e

if engine_api is not None and not hasattr(jax, "tree_map"):
  # JetStream 0.2.2's orchestrator frees each inserted prefix with `jax.tree_map`, which jax has since removed
  # (jax.tree.map is the same function). Put back here, only where missing, so that JetStream's own threads run
  # unmodified; nothing in jaxrlhf calls it.
  jax.tree_map = jax.tree.map

INSTALL_HINT = "pip install -e '.[jetstream]' (google-jetstream and what it imports: seqio, TensorFlow)"

# JetStream pads prompts to these lengths, up to the engine's max_prefill_length, which must be one of them
# (`token_utils.pad_tokens` looks it up in this list).
JETSTREAM_PREFILL_BUCKETS = tuple(2**i for i in range(4, 16))  # 16, 32, ..., 32768

# JetStream puts `bos_id` before a token-id prompt (0.2.2 always, later versions unless the request says it has
# one). Prompts are served as `jaxrlhf.generate` and the trainer tokenize them, with no special token added, so
# `bos_id` is this marker, which no tokenizer uses, and `prefill` drops it.
BOS_MARKER = -1


def _require_jetstream(what: str) -> None:
  if engine_api is None:
    raise ImportError(f"{what} needs google-jetstream: {INSTALL_HINT}; import failed: {_JETSTREAM_IMPORT_ERROR}")


def prefill_reports_first_token() -> bool:
  """True for JetStream's later API, whose `prefill` returns (Prefix, ResultTokens) and whose orchestrator
  reports that first token; False for 0.2.2 (`prefill -> Prefix`)."""
  _require_jetstream("prefill_reports_first_token")
  annotation = inspect.signature(engine_api.Engine.prefill).return_annotation
  if isinstance(annotation, str):
    return annotation.replace("typing.", "").startswith(("Tuple[", "tuple["))
  return typing.get_origin(annotation) is tuple


# The length a row without a valid token (a finished or empty slot, a refused request) reports. JetStream ends a
# request whose length passes its max_tokens before it reads the row's token; the later API would otherwise put
# that invalid token at the end of the response's token ids.
FINISHED_LENGTH = np.iinfo(np.int32).max


@jax.jit
def _finished_rows_at_finished_length(data_Bx3):
  valid_B, length_B = data_Bx3[:, 1], data_Bx3[:, 2]
  return data_Bx3.at[:, 2].set(jnp.where(valid_B != 0, length_B, FINISHED_LENGTH))


def to_jetstream_result(result: ResultTokens):
  """Our ResultTokens as JetStream's class (the fields the installed version has); rows without a valid token
  report `FINISHED_LENGTH`."""
  names = {field.name for field in dataclasses.fields(engine_api.ResultTokens)}
  assert (result.tokens_idx, result.valid_idx, result.length_idx) == ((0, 1), (1, 2), (2, 3))  # our layout
  fields = dict(
    data=_finished_rows_at_finished_length(result.data),
    tokens_idx=result.tokens_idx,
    valid_idx=result.valid_idx,
    length_idx=result.length_idx,
  )
  if "samples_per_slot" in names:
    fields["samples_per_slot"] = result.samples_per_slot
  if "log_prob" in names:
    fields["log_prob"] = result.log_probs
  return engine_api.ResultTokens(**fields)


_TokenizerBase: Any = tokenizer_api.Tokenizer if tokenizer_api is not None else object


class HFTokenizer(_TokenizerBase):
  """JetStream's `Tokenizer` over a checkpoint's HF tokenizer.

  encode: the text's ids with no special token added (as `jaxrlhf.generate` and the trainer tokenize prompts),
  right-padded by JetStream's `pad_tokens` to its bucket; a prompt longer than max_prefill_length keeps its true
  length, so that `prefill` refuses it. stop_tokens: the generation config's EOS ids (JetStream's default adds
  pad_id, which may be a token the model writes). bos_id: `BOS_MARKER`.
  """

  def __init__(self, tokenizer, eos_ids, pad_id: int, path: str = ""):
    _require_jetstream("HFTokenizer")
    if not eos_ids:
      raise ValueError(f"tokenizer {path!r}: no EOS id (expected eos_token_id in generation_config.json or tokenizer)")
    self.tokenizer = tokenizer
    self.eos_ids = tuple(int(i) for i in eos_ids)
    self._pad_id = int(pad_id)
    self.path = path

  @classmethod
  def from_path(cls, path: str) -> "HFTokenizer":
    """The tokenizer and generation config (EOS ids) of an HF checkpoint directory."""
    tokenizer = load_tokenizer(path)
    eos_ids = generation_eos_ids(path, tokenizer)
    return cls(tokenizer, eos_ids, pad_token_id(tokenizer, eos_ids), path)

  def encode(self, s: str, *, prefill_lengths=None, max_prefill_length=None, jax_padding=True, **unused):
    ids = np.asarray(self.tokenizer(s, add_special_tokens=False)["input_ids"], np.int32)
    return token_utils.pad_tokens(
      ids,
      self.bos_id,
      self.pad_id,
      is_bos=False,
      prefill_lengths=prefill_lengths,
      max_prefill_length=max_prefill_length,
      jax_padding=jax_padding,
    )

  def decode(self, token_ids, **unused) -> str:
    """The text of `token_ids`. JetStream streams a response one token at a time and joins the pieces; a token
    decoded alone loses the space a word-level tokenizer (the built-in tasks') or SentencePiece puts before it, so
    a single token is decoded after an anchor token and the anchor's text cut off (the pieces then join to the
    whole response's decode)."""
    ids = [int(t) for t in token_ids]
    if len(ids) != 1:
      return self.tokenizer.decode(ids, skip_special_tokens=True)
    anchor = self._anchor_id()
    head = self.tokenizer.decode([anchor], skip_special_tokens=True)
    text = self.tokenizer.decode([anchor, *ids], skip_special_tokens=True)
    return text[len(head) :] if head and text.startswith(head) else self.tokenizer.decode(ids, skip_special_tokens=True)

  def _anchor_id(self) -> int:
    """The lowest id that is no special token and decodes to text."""
    if not hasattr(self, "_anchor"):
      special = set(self.tokenizer.all_special_ids)
      candidates = (i for i in range(len(self.tokenizer)) if i not in special)
      self._anchor = next((i for i in candidates if self.tokenizer.decode([i]).strip()), 0)
    return self._anchor

  @property
  def pad_id(self) -> int:
    return self._pad_id

  @property
  def eos_id(self) -> int:
    return self.eos_ids[0]

  @property
  def bos_id(self) -> int:
    return BOS_MARKER

  @property
  def stop_tokens(self) -> set[int]:
    return set(self.eos_ids)


@struct.dataclass
class PrefillResult:
  """0.2.2's prefill result: the prefix and its first token, which `insert` holds for the slot's next report."""

  prefix: Prefix
  first: ResultTokens  # data [1, 3]


@struct.dataclass
class HeldDecodeState:
  """0.2.2's decode state: ours and the last results per slot, reported by the next `generate`."""

  state: DecodeState
  held: ResultTokens  # data [B, 3], log_probs [B, 1]


_EngineBase: Any = engine_api.Engine if engine_api is not None else object


class JetStreamEngine(_EngineBase):
  """`engine` behind JetStream's engine API (see the module docstring for the two versions).

  tokenizer: what `build_tokenizer` returns to JetStream's threads. params: what `load_params()` returns
  (JetStream's `server_lib` calls it with no argument); with arguments it loads an HF directory.
  """

  def __init__(self, engine: Engine, tokenizer: HFTokenizer, params=None):
    _require_jetstream("JetStreamEngine")
    if engine.max_prefill_length not in JETSTREAM_PREFILL_BUCKETS:
      raise ValueError(
        f"max_prefill_length={engine.max_prefill_length}: JetStream pads prompts to its buckets "
        f"{JETSTREAM_PREFILL_BUCKETS[0]}, {JETSTREAM_PREFILL_BUCKETS[1]}, ..., {JETSTREAM_PREFILL_BUCKETS[-1]}, "
        "so it must be one of them"
      )
    self.engine = engine
    self.tokenizer = tokenizer
    self.params = params
    self.reports_first_token = prefill_reports_first_token()

  # --- prefill ---------------------------------------------------------------------------------------

  def _prefill(self, params, padded_tokens, true_length, sampler=None, rng=None) -> tuple[Prefix, ResultTokens]:
    tokens = np.asarray(padded_tokens).reshape(-1)[: int(true_length)]
    tokens = tokens[tokens != BOS_MARKER]
    if not 1 <= len(tokens) <= self.engine.max_prefill_length or int(true_length) > np.size(padded_tokens):
      logging.error(
        "jaxrlhf JetStreamEngine: request refused: a prompt of true_length=%d (JetStream's count; expected 1..%d, "
        "the engine's max_prefill_length)",
        int(true_length),
        self.engine.max_prefill_length,
      )
      return self._finished_prefix(params)
    return self.engine.prefill(params=params, padded_tokens=tokens, true_length=len(tokens), sampler=sampler, rng=rng)

  def _finished_prefix(self, params) -> tuple[Prefix, ResultTokens]:
    """A prefix that is done and a first result that is not valid: the request ends with no token."""
    pad = self.engine.sampling.pad_token_id
    prefix, _ = self.engine.prefill(
      params=params, padded_tokens=np.full((1,), pad, np.int32), true_length=1, rng=request_key(0, 0, 0)
    )
    none = ResultTokens(data=jnp.asarray([[pad, 0, 0]], jnp.int32), log_probs=jnp.zeros((1, 1), jnp.float32))
    return prefix.replace(done=jnp.ones_like(prefix.done)), none

  def prefill(self, *, params, existing_prefix=None, padded_tokens, true_length, sampler=None, **unused):
    if existing_prefix is not None:
      raise NotImplementedError("prefill on top of an existing prefix is not supported")
    prefix, first = self._prefill(params, padded_tokens, true_length, sampler)
    if self.reports_first_token:
      return prefix, to_jetstream_result(first)
    return PrefillResult(prefix=prefix, first=first)

  def prefill_multisampling(
    self, *, params, existing_prefix=None, padded_tokens, true_length, sampler=None, rng=None, num_samples=1
  ):
    """One sample per slot (samples_per_slot is 1): num_samples must be 1."""
    if num_samples != 1:
      raise NotImplementedError(f"num_samples={num_samples}: this engine samples one sequence per request")
    if existing_prefix is not None:
      raise NotImplementedError("prefill on top of an existing prefix is not supported")
    prefix, first = self._prefill(params, padded_tokens, true_length, sampler, rng)
    return prefix, to_jetstream_result(first)

  # --- insert and generate ---------------------------------------------------------------------------

  def init_decode_state(self, *args, **kwargs):
    state = self.engine.init_decode_state()
    if self.reports_first_token:
      return state
    slots = self.engine.max_concurrent_decodes
    held = ResultTokens(data=jnp.zeros((slots, 3), jnp.int32), log_probs=jnp.zeros((slots, 1), jnp.float32))
    return HeldDecodeState(state=state, held=held)

  def insert(self, prefix, decode_state, slot: int, **unused):
    if self.reports_first_token:
      return self.engine.insert(prefix, decode_state, slot)
    held = decode_state.held
    return HeldDecodeState(
      state=self.engine.insert(prefix.prefix, decode_state.state, slot),
      held=held.replace(
        data=held.data.at[slot].set(prefix.first.data[0]),
        log_probs=held.log_probs.at[slot].set(prefix.first.log_probs[0]),
      ),
    )

  def bulk_insert(self, prefix, decode_state, slots: list[int], **unused):
    for slot in slots:
      decode_state = self.insert(prefix, decode_state, slot)
    return decode_state

  def generate(self, params, decode_state, sampler=None, **unused):
    if self.reports_first_token:
      decode_state, result = self.engine.generate(params, decode_state, sampler)
      return decode_state, to_jetstream_result(result)
    state, result = self.engine.generate(params, decode_state.state, sampler)
    return HeldDecodeState(state=state, held=result), to_jetstream_result(decode_state.held)

  def free_resource(self, slot: int):
    return self.engine.free_resource(slot)

  # --- everything else -------------------------------------------------------------------------------

  def load_params(self, *args, **kwargs):
    if not args and not kwargs:
      if self.params is None:
        raise ValueError("JetStreamEngine(params=None): pass the params, or call load_params(hf_checkpoint_dir)")
      return self.params
    return self.engine.load_params(*args, **kwargs)

  def get_prefix_destination_sharding(self):
    return self.engine.get_prefix_destination_sharding()

  def get_tokenizer(self):
    return tokenizer_pb2.TokenizerParameters(path=self.tokenizer.path)

  def build_tokenizer(self, metadata):
    return self.tokenizer

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

  @property
  def use_chunked_prefill(self) -> bool:
    return False

  @property
  def prefill_chunk_size(self) -> int:
    return self.engine.max_prefill_length
