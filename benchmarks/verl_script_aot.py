"""Will a verl run script fit? Translate it (`python -m jaxrlhf.verl_compat`) and compile the step it describes
ahead of time (`python -m jaxrlhf.aot`) for a target, with an architecture folder as the model.

    python benchmarks/verl_script_aot.py SCRIPT.sh --model configs/models/qwen2.5-72b-instruct --target h100:4x8 \
        [--phases] [--json OUT] [--config.KEY=VALUE ...]

The translated command's flags are kept as they are, except the model path (the script's checkpoint is not
here; the folder's config.json has the same architecture); flags after the options are added at the end
(they win). Prints the aot command, then its report; exits with the aot's status (1: does not fit).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def translated_flags(script: str) -> list[str]:
  """The `--config...` flags of the `python train.py` command verl_compat prints for `script`."""
  out = subprocess.run([sys.executable, "-m", "jaxrlhf.verl_compat", script], cwd=ROOT, capture_output=True, text=True)
  if out.returncode:
    sys.exit(f"verl_compat refused {script}:\n{out.stderr.strip()}")
  lines, command = out.stdout.splitlines(), []
  start = next(i for i, line in enumerate(lines) if line.startswith("python train.py"))
  for line in lines[start:]:
    if not line.strip():
      break
    command.append(line.rstrip().rstrip("\\"))
  return shlex.split(" ".join(command))[2:]  # without "python train.py"


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("script")
  parser.add_argument("--model", required=True, help="a folder with the architecture's config.json")
  parser.add_argument("--target", required=True)
  parser.add_argument("--phases", action="store_true")
  parser.add_argument("--json")
  args, extra = parser.parse_known_args()
  flags = [f for f in translated_flags(args.script) if not f.startswith("--config.actor_rollout_ref.model.path=")]
  command = (
    [
      sys.executable,
      "-m",
      "jaxrlhf.aot",
      *flags,
      f"--config.actor_rollout_ref.model.path={args.model}",
      *extra,
      "--target",
      args.target,
    ]
    + (["--phases"] if args.phases else [])
    + (["--json", args.json] if args.json else [])
  )
  print(shlex.join(["python"] + command[1:]), flush=True)
  sys.exit(subprocess.run(command, cwd=ROOT).returncode)


if __name__ == "__main__":
  main()
