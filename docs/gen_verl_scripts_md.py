"""Writes docs/verl_scripts.md: what a verl run script may contain, and what each verl key becomes.

    python docs/gen_verl_scripts_md.py            # rewrite docs/verl_scripts.md
    python docs/gen_verl_scripts_md.py --check    # exit 1 if docs/verl_scripts.md is out of date

The grammar comes from `jaxrlhf.verl_shell.GRAMMAR`, the keys from `jaxrlhf.verl_compat.SECTIONS`: the
table the translation reads, so the page cannot drift from it (tests/docs/test_verl_scripts_docs.py).
"""

from __future__ import annotations

import collections
import json
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from docs.gen_config_md import write_or_check  # noqa: E402
from jaxrlhf import verl_compat  # noqa: E402
from jaxrlhf.verl_shell import ENTRY_POINTS, GRAMMAR, OTHER_PROGRAMS  # noqa: E402

OUTPUT = os.path.join(_ROOT, "docs", "verl_scripts.md")
# Every key of verl 0.9.1's generated PPO trainer config, with its default (tests/cli/test_verl_keys.py checks them).
VERL_KEYS = os.path.join(_ROOT, "tests", "cli", "verl_0_9_1_keys.txt")
# The keys verl 0.9.1's generated Megatron PPO trainer config adds to those (its `megatron` sections, Megatron's
# optimizer keys).
VERL_MEGATRON_KEYS = os.path.join(_ROOT, "tests", "cli", "verl_0_9_1_megatron_keys.txt")


def verl_keys(path: str = VERL_KEYS) -> list[tuple[str, object]]:
  """[(key, verl's default)] from the key list (`key<TAB>JSON value` lines, # comments)."""
  with open(path) as file:
    rows = [line.rstrip("\n").split("\t", 1) for line in file if line.strip() and not line.startswith("#")]
  return [(key, json.loads(value)) for key, value in rows]


def _key_counts(path: str = VERL_KEYS) -> str:
  tree_types = verl_compat.base_tree_types()
  counts = collections.Counter(verl_compat.classify(key, tree_types) for key, _ in verl_keys(path))
  return ", ".join(f"{counts[name]} {name}" for name in verl_compat.CLASSES)


def _cell(text: str) -> str:
  return text.replace("|", "\\|").replace("\n", " ")


def _row(key: str, entry) -> str:
  if isinstance(entry, verl_compat.Translated):
    what, why = f"translated: {entry.target}", entry.note
  elif isinstance(entry, verl_compat.Refused):
    what, why = f"refused ({entry.family})", entry.reason
  elif entry.refuse is not None:
    what, why = f"ignored; refused ({entry.family}) for {entry.refuses}", entry.reason
  else:
    what, why = "ignored", entry.reason
  return f"| `{key}` | {_cell(what)} | {_cell(why)} |"


def render() -> str:
  lines = [
    "# verl run scripts",
    "",
    "`python -m jaxrlhf.verl_compat SCRIPT.sh` reads a verl run script (it runs nothing) and prints the",
    "`python train.py --config configs/verl_defaults.py --config.key=value ...` command that trains the same",
    "run, with a table of what each verl key became; `train.py key=value ...` takes verl's overrides as they",
    "are. This page is generated from the tables the code reads (`python docs/gen_verl_scripts_md.py`).",
    "",
    f"The verl command is `{ENTRY_POINTS[0]}` (or DAPO's `{ENTRY_POINTS[1]}` / `{ENTRY_POINTS[2]}`), run as",
    "`python3 -m ...`, through `ray job submit ... --` or as `verl/trainer/main_ppo.py`; other verl programs",
    f"({', '.join(f'`{name}`' for name in OTHER_PROGRAMS)}) are refused by name.",
    "",
    "In the printed command, `key=null` stays a verl override after the `--config.` flags (no flag can set",
    "None), and so does a value only your shell knows (`trainer.nnodes=\"$SLURM_JOB_NUM_NODES\"`) with every",
    "key translated from it (the mesh, the per-GPU micro-batches): train.py translates them when it runs.",
    "",
    "## What a script may contain",
    "",
    "| construct | read as |",
    "|---|---|",
    *[f"| {_cell(construct)} | {_cell(meaning)} |" for construct, meaning in GRAMMAR],
    "",
    "## What each verl key becomes",
    "",
    f"verl 0.9.1's generated PPO trainer config has {len(verl_keys())} keys: {_key_counts()}. Its Megatron",
    f"config (ppo_megatron_trainer) adds {len(verl_keys(VERL_MEGATRON_KEYS))} more: "
    f"{_key_counts(VERL_MEGATRON_KEYS)}. With verl's",
    "defaults none of the ignored ones is refused (tests/cli/test_verl_keys.py).",
    "",
    "A key of jaxrlhf's tree (docs/config.md) is mapped as it is: same name, same meaning. The keys below",
    "are verl's others. `*` matches any part of a key. *Ignored* keys have no meaning in jaxrlhf and are",
    "listed with the reason when a run starts; *refused* keys name a feature jaxrlhf does not have, one",
    "line per family; a key in neither list is an error that names it (with a suggestion when one is",
    "close). Every problem of a command line is reported at once.",
    "",
    "Hydra's base config: `--config-name=ppo_trainer` is verl's defaults (jaxrlhf's "
    "`configs/verl_defaults.py`), and so is `ppo_megatron_trainer` (its megatron sections' defaults translate to",
    "nothing: the keys a script sets are read as the Megatron-LM table below says); any other name is read from",
    "`<config-path>/<name>.yaml` (searched from where verl_compat runs, then from the folders above the script, where",
    "verl's scripts assume its checkout): a YAML on `defaults: [ppo_trainer, _self_]` becomes overrides placed before",
    "the script's own (verl's sglang_multiturn configs); one that cannot be found is refused, naming where it looked.",
  ]
  for title, entries in verl_compat.SECTIONS:
    lines += ["", f"### {title}", "", "| verl key | becomes | why |", "|---|---|---|"]
    lines += [_row(key, entry) for key, entry in entries.items()]
  lines += ["", "## Refused families", "", "| family | why |", "|---|---|"]
  lines += [f"| {family} | {_cell(reason)} |" for family, reason in verl_compat.FAMILIES.items()]
  return "\n".join(lines) + "\n"


def main(argv) -> int:
  return write_or_check(OUTPUT, render(), argv, "docs/gen_verl_scripts_md.py")


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
