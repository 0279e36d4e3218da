"""docs/config.md documents every key of the config tree with its current default (it cannot drift)."""

import importlib.util
import os

from jaxrlhf.config import get_base_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "config.md")


def _generator():
  spec = importlib.util.spec_from_file_location("gen_config_md", os.path.join(ROOT, "docs", "gen_config_md.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _leaves(config, prefix=""):
  for name in config.keys():
    value = config[name]
    if hasattr(value, "keys"):
      yield from _leaves(value, prefix + name + ".")
    else:
      yield prefix + name, value


def test_every_key_is_documented_with_its_current_default():
  with open(DOC) as f:
    rows = {line.split(" | ")[0][3:-1]: line for line in f if line.startswith("| `")}
  leaves = dict(_leaves(get_base_config()))
  assert len(leaves) > 100
  missing = sorted(set(leaves) - set(rows))
  assert not missing, f"docs/config.md lacks {missing}; run python docs/gen_config_md.py"
  stale = [key for key, value in leaves.items() if not rows[key].startswith(f"| `{key}` | `{value!r}` |")]
  assert not stale, f"docs/config.md has old defaults for {stale}; run python docs/gen_config_md.py"
  unknown = sorted(set(rows) - set(leaves))
  assert not unknown, f"docs/config.md documents keys the tree no longer has: {unknown}"


def test_every_key_has_a_meaning_and_a_verl_equivalent_and_the_file_is_current():
  generator = _generator()
  for key, _, _ in generator.walk(get_base_config()):
    meaning, verl = generator.describe(key)  # raises for an undocumented key
    assert meaning and verl, key
  with open(DOC) as f:
    assert f.read() == generator.render(), "docs/config.md is out of date: run python docs/gen_config_md.py"
