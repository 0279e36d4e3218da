"""Serve a checkpoint with JetStream: its orchestrator and gRPC `Orchestrator` service over our `Engine`.

    python -m jaxrlhf.serve --model PATH [--host HOST] [--port 9000] [--max_concurrent_decodes 8]
        [--max_prefill_length 1024] [--max_new_tokens 256] [--temperature T] (0 = greedy) [--top_p P]
        [--top_k K] [--seed S] [--dtype float32|bfloat16]

PATH: what `jaxrlhf.generate` takes (an HF checkpoint directory, a Hub model id, or a run's `global_step_N`).
Needs the `jetstream` extra: pip install -e '.[jetstream]'.

Clients call JetStream's `Decode` RPC (jetstream.core.proto.jetstream_pb2_grpc.OrchestratorStub) with a text
prompt (tokenized as `jaxrlhf.generate` does, no special token added) or token ids, and `max_tokens`; the
stream answers the response tokens (google-jetstream 0.2.2 leaves out EOS), each request ending at EOS,
`max_tokens` or --max_new_tokens. A request that cannot be served (a prompt longer than --max_prefill_length, an
empty one, max_tokens < 1) fails alone with INVALID_ARGUMENT and a message. SIGINT / SIGTERM stop the server
(exit 0). docs/serving.md has a client.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys

import jax

from jaxrlhf import cli
from jaxrlhf.errors import UserError
from jaxrlhf.generate import load_model
from jaxrlhf.models import cast_floating
from jaxrlhf.rollout import DEFAULT_LENGTH_BUCKETS, Engine, SamplingParams, jetstream_adapter
from jaxrlhf.rollout.jetstream_adapter import JETSTREAM_PREFILL_BUCKETS, HFTokenizer, JetStreamEngine

try:  # the optional extra, guarded once (as in jetstream_adapter)
  import grpc
  from jetstream.core import orchestrator
  from jetstream.core.proto import jetstream_pb2_grpc

  # Importing JetStream's orchestrator sends every log record at DEBUG to stdout (its module-level set-up); one
  # line per generate step is too much for a server: warnings only, unless -v.
  logging.getLogger().setLevel(logging.WARNING)
  _Servicer = orchestrator.LLMOrchestrator
except ImportError:
  grpc = orchestrator = jetstream_pb2_grpc = None
  _Servicer = object

PROG = "python -m jaxrlhf.serve"


def prompt_length(request, tokenizer: HFTokenizer) -> int:
  """The number of tokens the engine would prefill for a `DecodeRequest` (text or token ids)."""
  if request.WhichOneof("content") == "text_content":
    return len(tokenizer.tokenizer(request.text_content.text, add_special_tokens=False)["input_ids"])
  return len(request.token_content.token_ids)


def request_error(request, tokenizer: HFTokenizer, max_prefill_length: int) -> str | None:
  """Why a `DecodeRequest` cannot be served, or None."""
  if request.max_tokens < 1:
    return f"max_tokens={request.max_tokens}: expected at least 1 (the number of tokens to generate)"
  length = prompt_length(request, tokenizer)
  if not 1 <= length <= max_prefill_length:
    return f"a prompt of {length} tokens: this server takes 1..{max_prefill_length} (--max_prefill_length)"
  return None


class CheckedOrchestrator(_Servicer):
  """JetStream's `Orchestrator` service, refusing a request it cannot serve before it reaches JetStream's
  threads: INVALID_ARGUMENT and the reason (ValueError when called without a gRPC context)."""

  def __init__(self, driver, tokenizer: HFTokenizer, max_prefill_length: int):
    super().__init__(driver=driver)
    self.tokenizer = tokenizer
    self.max_prefill_length = max_prefill_length

  async def Decode(self, request, context=None):  # noqa: N802 (the RPC's name)
    error = request_error(request, self.tokenizer, self.max_prefill_length)
    if error is not None:
      if context is None:
        raise ValueError(error)
      await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error)
    async for response in super().Decode(request, context):
      yield response


def build_driver(served: JetStreamEngine):
  """JetStream's orchestrator with one engine doing both prefill and generate (interleaved)."""
  params = served.load_params()
  return orchestrator.Driver(
    prefill_engines=[served],
    generate_engines=[served],
    prefill_params=[params],
    generate_params=[params],
    interleaved_mode=True,
  )


async def serve(servicer, driver, address: str) -> None:
  """Serves until SIGINT or SIGTERM, then stops the gRPC server and JetStream's threads."""
  server = grpc.aio.server()
  jetstream_pb2_grpc.add_OrchestratorServicer_to_server(servicer, server)
  port, why = 0, "grpc returned port 0"
  try:
    port = server.add_insecure_port(address)
  except RuntimeError as e:
    why = str(e)
  if port == 0:
    driver.stop()
    raise UserError(f"--host/--port: cannot listen on {address!r}", hint=f"is the port in use? ({why})")
  await server.start()
  stop = asyncio.Event()
  loop = asyncio.get_running_loop()
  for signum in (signal.SIGINT, signal.SIGTERM):
    loop.add_signal_handler(signum, stop.set)
  print(f"{PROG}: serving JetStream's Orchestrator service on {address}", file=sys.stderr, flush=True)
  await stop.wait()
  await server.stop(grace=5)
  driver.stop()
  print(f"{PROG}: stopped", file=sys.stderr, flush=True)


def run(args) -> None:
  if orchestrator is None:
    raise UserError(f"{PROG} needs google-jetstream: {jetstream_adapter.INSTALL_HINT}")
  if args.verbose:
    logging.getLogger().setLevel(logging.INFO)
  params, model_config, tokenizer, eos_ids, pad_id = load_model(args.model)
  if args.dtype:
    model_config = dataclasses.replace(model_config, dtype=args.dtype)
    params = cast_floating(params, args.dtype)
  greedy = args.temperature <= 0
  sampling = SamplingParams(
    max_new_tokens=args.max_new_tokens,
    eos_token_ids=eos_ids,
    pad_token_id=pad_id,
    temperature=1.0 if greedy else args.temperature,
    top_k=args.top_k,
    top_p=args.top_p,
    do_sample=not greedy,
  )
  engine = Engine(
    model_config,
    sampling,
    max_concurrent_decodes=args.max_concurrent_decodes,
    prefill_buckets=[b for b in DEFAULT_LENGTH_BUCKETS if b < args.max_prefill_length],
    max_prefill_length=args.max_prefill_length,
    seed=args.seed,
  )
  hf_tokenizer = HFTokenizer(tokenizer, eos_ids, pad_id, path=args.model)
  served = JetStreamEngine(engine, hf_tokenizer, params=jax.device_put(params))
  driver = build_driver(served)
  servicer = CheckedOrchestrator(driver, hf_tokenizer, engine.max_prefill_length)
  asyncio.run(serve(servicer, driver, f"{args.host}:{args.port}"))


def parse_args(argv=None):
  parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
  parser.add_argument(
    "--model", required=True, help="HF checkpoint directory, Hub model id (org/name), or a run's global_step_N"
  )
  parser.add_argument("--host", default="[::]", help="address to listen on (default: all; 127.0.0.1: loopback)")
  parser.add_argument("--port", type=int, default=9000, help="gRPC port (JetStream's default 9000)")
  parser.add_argument("--max_concurrent_decodes", type=int, default=8, help="decode slots (requests in flight)")
  parser.add_argument(
    "--max_prefill_length",
    type=int,
    default=1024,
    help=f"longest prompt in tokens; one of JetStream's buckets {JETSTREAM_PREFILL_BUCKETS[0]}, "
    f"{JETSTREAM_PREFILL_BUCKETS[1]}, ..., {JETSTREAM_PREFILL_BUCKETS[-1]}",
  )
  parser.add_argument("--max_new_tokens", type=int, default=256, help="most tokens a response gets")
  parser.add_argument("--temperature", type=float, default=1.0, help="> 0 samples; 0 = greedy")
  parser.add_argument("--top_p", type=float, default=1.0)
  parser.add_argument("--top_k", type=int, default=-1, help="-1 = off")
  parser.add_argument("--seed", type=int, default=0, help="request k samples with key (seed, k)")
  parser.add_argument(
    "--dtype",
    choices=("float32", "bfloat16"),
    default=None,
    help="compute dtype (weights cast once); default: the checkpoint's",
  )
  parser.add_argument("-v", "--verbose", action="store_true", help="JetStream's INFO logs and error tracebacks")
  args = parser.parse_args(argv)
  for name, low in (("max_concurrent_decodes", 1), ("max_new_tokens", 1), ("port", 1)):
    if getattr(args, name) < low:
      parser.error(f"--{name} must be >= {low}, got {getattr(args, name)}")
  if args.max_prefill_length not in JETSTREAM_PREFILL_BUCKETS:
    parser.error(
      f"--max_prefill_length must be one of JetStream's prefill buckets {list(JETSTREAM_PREFILL_BUCKETS)}, "
      f"got {args.max_prefill_length}"
    )
  if not args.temperature >= 0.0 or args.temperature == float("inf"):
    parser.error(f"--temperature must be > 0 (sampling) or 0 (greedy), got {args.temperature}")
  if not 0.0 < args.top_p <= 1.0:
    parser.error(f"--top_p must be in (0, 1], got {args.top_p}")
  if args.top_k == 0 or args.top_k < -1:
    parser.error(f"--top_k must be -1 (off) or >= 1, got {args.top_k}")
  return args


def main(argv=None):
  args = parse_args(argv)
  cli.run(PROG, run, args, verbose=args.verbose)


if __name__ == "__main__":
  main()
