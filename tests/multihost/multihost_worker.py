"""One process of a multi-host run on localhost (gloo CPU collectives): one PPO step, metrics to JSON.

python multihost_worker.py PROCESS_ID NUM_PROCESSES PORT DEVICES_PER_PROCESS OUT_PREFIX RUN_DIR
"""

import json
import os
import sys

process_id, num_processes, port, local_devices, out_prefix, run_dir = sys.argv[1:7]
# The test's flags (tests.helpers.subprocess_env: LLVM at -O1) and this process's devices.
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={local_devices}"

import jax  # noqa: E402

if int(num_processes) > 1:
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
    coordinator_address=f"localhost:{port}", num_processes=int(num_processes), process_id=int(process_id)
  )

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jaxrlhf.config import load_config_file  # noqa: E402

config = load_config_file(os.path.join(root, "configs", "quickstart.py"))
config.mesh.fsdp = -1
config.data.train_batch_size = 8
config.actor_rollout_ref.actor.ppo_mini_batch_size = 4
config.trainer.default_local_dir = os.path.join(run_dir, f"process{process_id}")

from jaxrlhf.trainer import Trainer  # noqa: E402

trainer = Trainer(config)
metrics = trainer.train_step(0)
params = jax.tree.leaves(trainer.state.actor.params)
metrics["param_checksum"] = float(sum(jax.numpy.sum(p).item() for p in params))
with open(f"{out_prefix}.{process_id}.json", "w") as f:
  json.dump({k: v for k, v in metrics.items() if not k.startswith(("timing", "perf/t", "perf/mfu"))}, f)
