"""Accelerator targets to compile for without the hardware: names -> abstract devices and their memory.

Names (`--target`):
- NVIDIA: `h100x8`, `h200x8` (one host of G GPUs: `h100xG`), multi-node `h100:NxG` / `h200:NxG`
  (N hosts x G GPUs). Devices come from `jax.experimental.topologies.get_topology_desc(platform="cuda")`
  with a `GpuTargetConfigProto` written from `GPU_SPECS` (needs `jax-cuda12-plugin`, `pip install '.[aot]'`).
- TPU: `v4-N`, `v5p-N` (N TensorCores, Cloud TPU naming: two per chip, one megacore device per chip),
  `v5e-N`, `v6e-N` (N chips). Devices come from `get_topology_desc("<gen>:<topology>", "tpu")` (needs
  `libtpu`, which `jax[tpu]` brings).

Device memory is the usable HBM per device: what the GPU driver reports (H100 80 GB: 84,942,979,072 B)
or the TPU chip's HBM. XLA's GPU compiler does not refuse a program that is too big, so the report
compares the compiled program's bytes with these numbers itself.

`prepare_environment()` must run before JAX initialises its backends: it keeps the local backend on
CPU (no GPU or TPU is looked for) and quiets libtpu's complaints about the missing TPU hardware.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

from jaxrlhf.errors import UserError

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class GpuSpec:
  """The facts of one GPU model that XLA's compiler reads (`stream_executor.GpuDeviceInfoProto`)."""

  name: str
  memory_bytes: int
  core_count: int  # streaming multiprocessors
  memory_bandwidth: int  # bytes/s
  clock_rate_ghz: float
  l2_cache_size: int
  compute_capability: tuple[int, int]
  peak_bf16_flops: float  # dense

  def target_config(self) -> str:
    """A `GpuTargetConfigProto` in text format for `get_topology_desc(target_config=...)`."""
    major, minor = self.compute_capability
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: {self.core_count}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {self.memory_bandwidth}
  l2_cache_size: {self.l2_cache_size}
  clock_rate_ghz: {self.clock_rate_ghz}
  device_memory_size: {self.memory_bytes}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 1 }}
device_description_str: "{self.name}"
"""


# Hopper SXM parts; memory as the driver reports it (what a program can use), bandwidth in bytes/s.
GPU_SPECS = {
  "h100": GpuSpec(
    "NVIDIA H100 80GB HBM3",
    memory_bytes=84_942_979_072,
    core_count=132,
    memory_bandwidth=3_352_320_000_000,
    clock_rate_ghz=1.98,
    l2_cache_size=52_428_800,
    compute_capability=(9, 0),
    peak_bf16_flops=989e12,
  ),
  "h200": GpuSpec(
    "NVIDIA H200 141GB HBM3e",
    memory_bytes=151_397_597_184,
    core_count=132,
    memory_bandwidth=4_800_000_000_000,
    clock_rate_ghz=1.98,
    l2_cache_size=52_428_800,
    compute_capability=(9, 0),
    peak_bf16_flops=989e12,
  ),
}


@dataclasses.dataclass(frozen=True)
class TpuSpec:
  topology_prefix: str  # get_topology_desc's generation name
  memory_bytes: int  # HBM per device (chip)
  cores_per_device: int  # TensorCores in one device: N in `v4-N` / `v5p-N` counts cores
  dims: int  # 2D (v5e, v6e) or 3D (v4, v5p) torus
  peak_bf16_flops: float
  chip_config_name: str | None = None


TPU_SPECS = {
  "v4": TpuSpec("v4", 32 * GIB, cores_per_device=2, dims=3, peak_bf16_flops=275e12, chip_config_name="megacore"),
  "v5p": TpuSpec("v5p", 95 * GIB, cores_per_device=2, dims=3, peak_bf16_flops=459e12, chip_config_name="megacore"),
  "v5e": TpuSpec("v5e", 16 * GIB, cores_per_device=1, dims=2, peak_bf16_flops=197e12),
  "v6e": TpuSpec("v6e", 32 * GIB, cores_per_device=1, dims=2, peak_bf16_flops=918e12),
}


class TargetError(UserError, ValueError):
  """A --target name that is not understood, or whose compiler is not installed."""


@dataclasses.dataclass(frozen=True)
class Target:
  name: str
  platform: str  # "cuda" | "tpu"
  num_devices: int
  memory_bytes: int  # per device
  peak_bf16_flops: float  # per device
  device_kind: str
  topology: str  # what get_topology_desc is given

  def devices(self) -> list:
    """The target's abstract devices, in the order the topology lists them."""
    from jax.experimental import topologies

    try:
      if self.platform == "cuda":
        spec = GPU_SPECS[self.name.split(":")[0].split("x")[0]]
        topology = topologies.get_topology_desc(
          platform="cuda", topology_name=self.name, topology=self.topology, target_config=spec.target_config()
        )
      else:
        spec = TPU_SPECS[self.name.split("-")[0]]
        kwargs = {"chip_config_name": spec.chip_config_name} if spec.chip_config_name else {}
        topology = topologies.get_topology_desc(self.topology, "tpu", **kwargs)
    except Exception as e:  # the plugin's errors are RuntimeError/ValueError/ImportError by version
      package = "jax-cuda12-plugin" if self.platform == "cuda" else "libtpu"
      raise TargetError(
        f"--target {self.name}: cannot build the {self.platform} topology {self.topology!r} "
        f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); is {package} installed "
        f"for this jax version? pip install -e '.[aot]'"
      ) from None
    devices = list(topology.devices)
    if len(devices) != self.num_devices:
      raise TargetError(
        f"--target {self.name}: topology {self.topology!r} has {len(devices)} devices, expected {self.num_devices}"
      )
    return devices


def _tpu_topology(chips: int, dims: int, name: str) -> str:
  """Cloud TPU slice shapes: 2D v5e-8 -> 2x4, v5e-256 -> 16x16; 3D 4 chips -> 2x2x1, 32 -> 2x4x4, 64 -> 4x4x4."""
  if chips < 1 or chips & (chips - 1):
    raise TargetError(f"--target {name}: the chip count {chips} must be a power of two")
  shape = [1] * dims
  order = [1, 0] if dims == 2 else [0, 1, 2] + [2, 1, 0] * 8
  for i in range(int(math.log2(chips))):
    axis = order[i % 2] if dims == 2 else order[i]
    shape[axis] *= 2
  return "x".join(str(d) for d in shape)


def parse_target(name: str) -> Target:
  """`h100x8`, `h200:4x8`, `v5e-8`, `v5p-64`, ... -> Target (see the module docstring)."""
  gpu = re.fullmatch(r"(h100|h200)(?:x(\d+)|:(\d+)x(\d+))", name)
  if gpu:
    spec = GPU_SPECS[gpu.group(1)]
    hosts, per_host = (1, int(gpu.group(2))) if gpu.group(2) else (int(gpu.group(3)), int(gpu.group(4)))
    if hosts < 1 or per_host < 1:
      raise TargetError(f"--target {name}: hosts and GPUs per host must be positive")
    return Target(
      name,
      "cuda",
      hosts * per_host,
      spec.memory_bytes,
      spec.peak_bf16_flops,
      spec.name,
      topology=f"1x{hosts}x{per_host}",
    )
  tpu = re.fullmatch(r"(v4|v5p|v5e|v6e)-(\d+)", name)
  if tpu:
    spec = TPU_SPECS[tpu.group(1)]
    count = int(tpu.group(2))
    if count % spec.cores_per_device:
      raise TargetError(f"--target {name}: {tpu.group(1)}-N counts TensorCores, two per chip: N must be even")
    chips = count // spec.cores_per_device
    topology = _tpu_topology(chips, spec.dims, name)
    return Target(
      name,
      "tpu",
      chips,
      spec.memory_bytes,
      spec.peak_bf16_flops,
      f"TPU {tpu.group(1)}",
      topology=f"{spec.topology_prefix}:{topology}",
    )
  raise TargetError(
    f"--target {name!r} is not known; expected h100x8, h200x8, h100:NxG / h200:NxG (hosts x GPUs), "
    "v4-N, v5p-N (TensorCores), v5e-N or v6e-N (chips)"
  )


def prepare_environment(target: Target) -> None:
  """Before JAX starts: a CPU-only local backend, and libtpu told it runs without TPU hardware."""
  os.environ["JAX_PLATFORMS"] = "cpu"
  if target.platform == "tpu":
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-16")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
