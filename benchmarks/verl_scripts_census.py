"""How many real verl run scripts translate: `python -m jaxrlhf.verl_compat` over every verl script in a folder.

    python benchmarks/verl_scripts_census.py DIR [--module jaxrlhf.verl_compat] [--verl-yaml FILE] [--json OUT]

Every `*.sh` under DIR that runs a verl trainer (`main_ppo`, `main_dapo`, `verl.trainer.main_*`) is given to
`python -m MODULE SCRIPT` in a clean environment (HOME=/home/user, no SLURM or user variables), as a new
user would run it. Outcomes:
  - translated, no key ignored / translated, some keys ignored (exit 0; "# ignored:" in the report);
  - exit 0 but empty (no key mapped: the old reader's silent drop);
  - refused (exit 2), counted per reason family (a script counts once in each family it hits):
    `refused (family)` lines, `unknown key`, `bad value`, `reader` (the script line it cannot read),
    `other verl program`; with --verl-yaml (verl's `_generated_ppo_trainer.yaml`), unknown keys split into
    those verl 0.9.1 has and those it lacks too (scripts written for older verl);
  - crashed (any other exit: a bug).
`--module` names another copy of the translator (the census before a change: a saved old verl_compat on
PYTHONPATH). Raw results go to benchmarks/results/verl_scripts_census.json (or --json).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERL_COMMAND = re.compile(r"main_ppo|main_dapo|verl\.trainer\.main_\w+")


def verl_scripts(folder: str) -> list[str]:
  found = []
  for parent, _, names in os.walk(folder):
    for name in sorted(names):
      path = os.path.join(parent, name)
      if name.endswith(".sh"):
        with open(path, errors="replace") as f:
          if VERL_COMMAND.search(f.read()):
            found.append(path)
  return sorted(found)


def _yaml_keys(path: str) -> set[str]:
  import yaml

  with open(path) as f:
    tree = yaml.safe_load(f)
  keys = set()

  def walk(node, prefix):
    for name, value in node.items():
      keys.add(prefix + str(name))
      if isinstance(value, dict):
        walk(value, f"{prefix}{name}.")

  walk(tree, "")
  return keys


def families(stderr: str, verl_keys: set[str] | None) -> list[str]:
  """The reason families of a refusal (exit 2), from the error lines."""
  out = []
  lines = stderr.splitlines()
  start = next((k for k, line in enumerate(lines) if ": error: " in line), len(lines))
  message = (
    [lines[start]] + [line for line in lines[start + 1 :] if line.startswith("  ")] if start < len(lines) else []
  )
  for line in message:  # the error line and its indented list (JAX's start-up logging is not part of it)
    line = re.sub(r"^\S+: (error|hint): ", "", line).strip()
    if not line or line.startswith(("docs/", "looked for", "jaxrlhf.verl_compat.TABLE")) or "problems with" in line:
      continue
    match = re.match(r"refused \(([^)]+)\)", line)
    if match:
      out.append(match.group(1))
    elif re.match(r"\S+\.sh:\d+: ", line):
      out.append("reader: " + re.sub(r"^\S+\.sh:\d+: ", "", line)[:70])
    elif line.startswith("unknown config key"):
      key = re.search(r"'([^']+)'", line).group(1)
      parts = key.split(".")
      if verl_keys is None:
        out.append("unknown key")
      elif key in verl_keys or any(".".join(parts[:k]) in _OPEN_DICTS for k in range(1, len(parts))):
        out.append("unknown key (verl 0.9.1 has it)")
      else:
        out.append("unknown key (verl 0.9.1 lacks it too)")
    elif "needs this value" in line:
      out.append("a value only the shell knows decides")
    elif " expects " in line or "must be" in line or "cannot read " in line or re.match(r"[\w.]+=", line):
      out.append("bad value")
    elif "has no `python3 -m verl" in line or re.search(r"runs \S+ \(", line):
      out.append("other verl program")
    else:
      out.append(line[:70])
  return sorted(set(out))


# verl keys whose values are free dicts (any key under them is verl's).
_OPEN_DICTS = {
  "actor_rollout_ref.model.override_config",
  "actor_rollout_ref.rollout.engine_kwargs",
  "critic.model.override_config",
  "ray_kwargs.ray_init",
  "data.apply_chat_template_kwargs",
  "data.mm_processor_kwargs",
  "actor_rollout_ref.actor.megatron.override_transformer_config",
  "actor_rollout_ref.actor.megatron.override_ddp_config",
}


def census(folder: str, module: str, verl_yaml: str | None, pythonpath: str | None) -> dict:
  verl_keys = _yaml_keys(verl_yaml) if verl_yaml else None
  env = {
    "HOME": "/home/user",
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "JAX_PLATFORMS": "cpu",
    "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, ROOT) if p),
  }
  rows = []
  for path in verl_scripts(folder):
    result = subprocess.run(
      [sys.executable, "-m", module, path], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    if result.returncode == 0:
      outcome = (
        "exit 0 but empty"
        if "# mapped:" not in result.stdout and "# translated:" not in result.stdout
        else "translated, some keys ignored"
        if "# ignored:" in result.stdout
        else "translated, no key ignored"
      )
      reasons = []
    elif result.returncode == 2:
      outcome, reasons = "refused", families(result.stderr, verl_keys)
    else:
      outcome, reasons = "crashed", [result.stderr.strip().splitlines()[-1][:100] if result.stderr.strip() else "?"]
    rows.append(
      {
        "script": os.path.relpath(path, folder),
        "outcome": outcome,
        "reasons": reasons,
        "stderr": result.stderr[-2000:] if result.returncode else "",
      }
    )
  outcomes = collections.Counter(row["outcome"] for row in rows)
  reasons = collections.Counter(reason for row in rows for reason in row["reasons"])
  only = collections.Counter(row["reasons"][0] for row in rows if len(row["reasons"]) == 1)
  return {
    "folder": folder,
    "module": module,
    "scripts": len(rows),
    "outcomes": dict(outcomes),
    "refusal_families": dict(reasons),
    "sole_refusal_family": dict(only),
    "rows": rows,
  }


def main(argv) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("folder", help="a folder of verl run scripts (searched recursively)")
  parser.add_argument("--module", default="jaxrlhf.verl_compat", help="the translator to run (python -m MODULE)")
  parser.add_argument("--pythonpath", default=None, help="a folder to put before the repository on PYTHONPATH")
  parser.add_argument("--verl-yaml", default=None, help="verl's _generated_ppo_trainer.yaml (splits unknown keys)")
  parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "verl_scripts_census.json"))
  args = parser.parse_args(argv)
  result = census(args.folder, args.module, args.verl_yaml, args.pythonpath)
  print(f"{result['scripts']} verl scripts in {args.folder} ({args.module})")
  print("\n| outcome | scripts |\n|---|---|")
  for outcome, count in sorted(result["outcomes"].items(), key=lambda item: -item[1]):
    print(f"| {outcome} | {count} |")
  if result["refusal_families"]:
    print("\n| refusal family | scripts | the only reason in |\n|---|---|---|")
    for family, count in sorted(result["refusal_families"].items(), key=lambda item: -item[1]):
      print(f"| {family} | {count} | {result['sole_refusal_family'].get(family, 0)} |")
  os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
  with open(args.json, "w") as f:
    json.dump(result, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
