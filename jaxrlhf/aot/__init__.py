"""Ahead-of-time compilation for accelerator targets this machine does not have (`python -m jaxrlhf.aot`).

`targets` turns a name (`h100x8`, `h200:8x8`, `v5e-8`, `v5p-64`, ...) into abstract devices and their
memory; `compile` builds the trainer's own step for a config on those devices, compiles it and
measures per-device memory, FLOPs and compile time. Importing this package does not start JAX: the
command line sets the platform first (`targets.prepare_environment`).
"""
