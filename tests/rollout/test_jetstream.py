"""JetStream for real (google-jetstream, installed by the test extra; a missing package fails here, never skips):
its own orchestrator, interleaved and disaggregated, answers concurrent requests with exactly jaxrlhf's greedy
tokens (the first included, nothing appended); a request that does not fit fails alone; `python -m jaxrlhf.serve`
answers JetStream's gRPC client on loopback."""

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import jax
import numpy as np
import pytest
from jetstream.core import orchestrator
from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc
from jetstream.engine import engine_api, tokenizer_api

from jaxrlhf import generate as generate_cli
from jaxrlhf.data.builtin import build_tokenizer
from jaxrlhf.models import Decoder, init_params
from jaxrlhf.rollout import Engine, SamplingParams
from jaxrlhf.rollout.jetstream_adapter import BOS_MARKER, FINISHED_LENGTH, HFTokenizer, JetStreamEngine
from jaxrlhf.serve import CheckedOrchestrator
from tests.helpers import free_port, subprocess_env

# Importing JetStream's orchestrator set the root logger to DEBUG with a handler on this process's stdout: the root
# logger as it was for the other tests that share this process (JetStream logs every generate step at INFO).
for _handler in [h for h in logging.getLogger().handlers if getattr(h, "stream", None) is sys.stdout]:
  logging.getLogger().removeHandler(_handler)
logging.getLogger().setLevel(logging.WARNING)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EOS = 3
MAX_NEW_TOKENS = 12
GREEDY = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(EOS,), pad_token_id=0, do_sample=False)


@pytest.fixture(scope="module")
def setup(tiny_model_config):
  params, _ = init_params(Decoder(tiny_model_config), jax.random.key(0))
  rng = np.random.RandomState(0)
  prompts = [[int(t) for t in rng.randint(4, 64, rng.randint(1, 16))] for _ in range(7)]
  rows, _ = generate_cli.sample_responses(params, tiny_model_config, prompts, GREEDY)
  greedy = [row["response_ids"] for row in rows]
  assert any(ids[-1] == EOS for ids in greedy) and any(len(ids) == MAX_NEW_TOKENS for ids in greedy)
  return tiny_model_config, params, prompts, greedy


def _served(model_config, params, slots=3) -> JetStreamEngine:
  engine = Engine(model_config, GREEDY, max_concurrent_decodes=slots, prefill_buckets=(8, 16))
  return JetStreamEngine(engine, HFTokenizer(build_tokenizer(), (EOS,), 0), params=params)


def _token_request(prompt, max_tokens=MAX_NEW_TOKENS):
  content = jetstream_pb2.DecodeRequest.TokenContent(token_ids=prompt)
  return jetstream_pb2.DecodeRequest(token_content=content, max_tokens=max_tokens)


async def _decode(service, request) -> list[int]:
  tokens = []
  async for response in service.Decode(request):
    tokens.extend(response.stream_content.samples[0].token_ids)
  return tokens


@contextlib.contextmanager
def running_driver(prefill_engine, generate_engine, params, interleaved=True):
  """JetStream's Driver and an event loop for its servicer. The loop outlives the driver's threads: JetStream's
  detokenize thread still calls into a request's loop just after the stream has ended, and on a closed loop that
  call raises and the thread kills the process (a server's loop runs until the server stops)."""
  loop = asyncio.new_event_loop()
  driver = orchestrator.Driver(
    prefill_engines=[prefill_engine],
    generate_engines=[generate_engine],
    prefill_params=[params],
    generate_params=[params],
    interleaved_mode=interleaved,
  )
  try:
    yield driver, loop
  finally:
    driver.stop()
    loop.close()


def _answers(loop, service, requests) -> list:
  """Every request at once through JetStream's servicer; an exception is that request's answer."""

  async def run_all():
    return await asyncio.gather(*(_decode(service, r) for r in requests), return_exceptions=True)

  return loop.run_until_complete(run_all())


def _without_eos(ids):
  """JetStream reports no stop token: a response is jaxrlhf's tokens up to EOS."""
  return ids[:-1] if ids and ids[-1] == EOS else ids


def test_adapter_is_jetstreams_engine_and_tokenizer(setup):
  model_config, params, prompts, greedy = setup
  served = _served(model_config, params)
  assert isinstance(served, engine_api.Engine)  # instantiable: every abstract method of the installed API
  # ... and of the repository's later API, which adds these abstract members.
  for name in ("bulk_insert", "prefill_multisampling", "use_chunked_prefill", "prefill_chunk_size"):
    assert hasattr(JetStreamEngine, name)
  tokenizer = served.build_tokenizer(served.get_tokenizer())
  assert isinstance(tokenizer, tokenizer_api.Tokenizer)
  assert tokenizer.stop_tokens == {EOS} and tokenizer.eos_id == EOS and tokenizer.pad_id == 0
  assert tokenizer.bos_id == BOS_MARKER
  ids = build_tokenizer()("first : 3 5", add_special_tokens=False)["input_ids"]
  padded, length = tokenizer.encode("first : 3 5", max_prefill_length=16, jax_padding=False)
  assert length == len(ids) and list(padded) == ids + [0] * (16 - len(ids))  # JetStream's smallest bucket is 16
  assert tokenizer.decode(ids) == "first : 3 5"
  with pytest.raises(ValueError, match="max_prefill_length=12: JetStream pads prompts to its buckets 16, 32"):
    JetStreamEngine(Engine(model_config, GREEDY, prefill_buckets=(12,)), tokenizer)


@pytest.mark.parametrize("interleaved", [True, False], ids=["interleaved", "disaggregated"])
def test_orchestrator_answers_concurrent_requests_with_jaxrlhf_greedy_tokens(setup, interleaved):
  model_config, params, prompts, greedy = setup
  prefill_engine = _served(model_config, params)
  generate_engine = prefill_engine if interleaved else _served(model_config, params)
  with running_driver(prefill_engine, generate_engine, params, interleaved) as (driver, loop):
    too_long = list(range(4, 4 + 17))  # max_prefill_length is 16
    requests = [_token_request(p) for p in prompts] + [_token_request(too_long), _token_request(prompts[0], 5)]
    answers = _answers(loop, orchestrator.LLMOrchestrator(driver), requests)
    # 7 requests over 3 slots: requests wait for slots freed by others, as in any server.
    assert answers[: len(prompts)] == [_without_eos(ids) for ids in greedy]
    assert answers[len(prompts)] == []  # JetStream's own servicer: the request ends empty, the server goes on
    assert answers[-1] == greedy[0][:5]  # the request's max_tokens
    running = {thread.name for thread in threading.enumerate()}  # JetStream's threads, which die with the process
    assert {"prefill-0", "transfer-0", "generate-0", "detokenize-0"} <= running


def test_a_request_that_does_not_fit_fails_alone_with_a_message(setup):
  model_config, params, prompts, greedy = setup
  served = _served(model_config, params, slots=2)
  with running_driver(served, served, params) as (driver, loop):
    service = CheckedOrchestrator(driver, served.tokenizer, served.max_prefill_length)
    requests = [_token_request(list(range(4, 4 + 17))), _token_request(prompts[1]), _token_request(prompts[2], 0)]
    too_long, answer, no_tokens = _answers(loop, service, requests)
    assert isinstance(too_long, ValueError) and "a prompt of 17 tokens: this server takes 1..16" in str(too_long)
    assert isinstance(no_tokens, ValueError) and "max_tokens=0: expected at least 1" in str(no_tokens)
    assert answer == _without_eos(greedy[1])


def test_later_api_reports_the_first_token_at_prefill(setup):
  """The repository's later API (prefill -> (Prefix, ResultTokens)), driven by hand as its orchestrator does."""
  model_config, params, prompts, greedy = setup
  served = _served(model_config, params)
  served.reports_first_token = True  # what `prefill_reports_first_token()` finds in that version
  prompt = prompts[3]
  prefix, first = served.prefill(
    params=params, padded_tokens=np.asarray([BOS_MARKER] + prompt), true_length=1 + len(prompt)
  )
  assert isinstance(first, engine_api.ResultTokens)
  tokens = [int(first.convert_to_numpy().get_result_at_slot(0).tokens[0, 0])]
  state = served.bulk_insert(prefix, served.init_decode_state(), [2])
  while True:
    state, result = served.generate(params, state)
    slot = result.convert_to_numpy().get_result_at_slot(2)
    if not slot.valid[0, 0]:
      # A finished row's length passes any max_tokens: that version's orchestrator would else append its token.
      assert slot.lengths[0] == FINISHED_LENGTH
      break
    tokens.append(int(slot.tokens[0, 0]))
  assert tokens == greedy[3]
  with pytest.raises(NotImplementedError, match="num_samples=2"):
    served.prefill_multisampling(
      params=params, padded_tokens=np.asarray(prompt), true_length=len(prompt), num_samples=2
    )


def test_a_missing_import_of_jetstream_is_named():
  """seqio (and so TensorFlow) is what google-jetstream imports first; the error says so, not just 'install'."""
  code = (
    "import sys; sys.modules['seqio'] = None\n"
    "from jaxrlhf.rollout import jetstream_adapter\n"
    "jetstream_adapter.JetStreamEngine(None, None)\n"
  )
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0 and "ImportError: JetStreamEngine needs google-jetstream" in proc.stderr
  assert "pip install -e '.[jetstream]'" in proc.stderr and "seqio" in proc.stderr.splitlines()[-1]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  from tests.models import hf_fixtures

  path = tmp_path_factory.mktemp("hf_qwen2_serve")
  hf_fixtures.save_model(hf_fixtures.build_model("qwen2_tied", seed=1), path)
  build_tokenizer(save_dir=str(path))
  return str(path)


@pytest.mark.slow
def test_serve_answers_jetstreams_grpc_client_on_loopback(hf_dir):
  params, model_config, tokenizer, eos_ids, pad_id = generate_cli.load_model(hf_dir)
  prompts = ["first : 3 5 7", "last : 1 2", "7 + 8 = ?"]
  prompt_ids = [generate_cli.encode_prompt(tokenizer, p, chat=False) for p in prompts]
  sampling = SamplingParams(max_new_tokens=8, eos_token_ids=eos_ids, pad_token_id=pad_id, do_sample=False)
  rows, _ = generate_cli.sample_responses(params, model_config, prompt_ids, sampling)
  expected = [[t for t in row["response_ids"] if t not in eos_ids] for row in rows]

  port = free_port()
  env = subprocess_env(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  args = ["--model", hf_dir, "--host", "127.0.0.1", "--port", port, "--temperature", 0, "--max_new_tokens", 8]
  args += ["--max_prefill_length", 16, "--max_concurrent_decodes", 2]
  server = subprocess.Popen(
    [sys.executable, "-m", "jaxrlhf.serve", *map(str, args)],
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
      grpc.channel_ready_future(channel).result(timeout=120)
      stub = jetstream_pb2_grpc.OrchestratorStub(channel)

      def decode(request):
        responses = list(stub.Decode(request, timeout=120))
        text = "".join(r.stream_content.samples[0].text for r in responses)
        return [t for r in responses for t in r.stream_content.samples[0].token_ids], text

      text_requests = [
        jetstream_pb2.DecodeRequest(text_content=jetstream_pb2.DecodeRequest.TextContent(text=p), max_tokens=8)
        for p in prompts
      ]
      with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(decode, text_requests + [_token_request(prompt_ids[1], 8)]))
      assert [ids for ids, _ in answers[:3]] == expected  # text prompts, concurrently, 2 slots
      assert answers[0][1].split() == tokenizer.decode(expected[0], skip_special_tokens=True).split()
      assert answers[3][0] == expected[1]  # the same prompt as token ids
      with pytest.raises(grpc.RpcError) as refused:
        decode(_token_request(list(range(4, 4 + 17)), 8))
      assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
      assert "a prompt of 17 tokens: this server takes 1..16 (--max_prefill_length)" in refused.value.details()
      assert decode(_token_request(prompt_ids[2], 8))[0] == expected[2]  # the server goes on
  finally:
    server.send_signal(signal.SIGTERM)
    try:
      stdout, stderr = server.communicate(timeout=60)
    except subprocess.TimeoutExpired:
      server.kill()
      stdout, stderr = server.communicate()
  assert server.returncode == 0, stderr[-3000:]
  assert "serving JetStream's Orchestrator service on 127.0.0.1" in stderr and "stopped" in stderr


def test_serve_names_bad_input(tmp_path, capsys):
  from jaxrlhf import serve

  with pytest.raises(SystemExit) as exited:
    serve.parse_args(["--model", str(tmp_path), "--max_prefill_length", "100"])
  assert exited.value.code == 2
  assert "--max_prefill_length must be one of JetStream's prefill buckets [16, 32," in capsys.readouterr().err
  missing = tmp_path / "no_such_checkpoint"
  env = subprocess_env(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  proc = subprocess.run(
    [sys.executable, "-m", "jaxrlhf.serve", "--model", str(missing)],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert f"python -m jaxrlhf.serve: error: --model {str(missing)!r} is not a directory" in proc.stderr
