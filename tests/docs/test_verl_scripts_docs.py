"""docs/verl_scripts.md is generated from the tables jaxrlhf.verl_compat reads (it cannot drift)."""

import importlib.util
import os

from jaxrlhf import verl_compat
from jaxrlhf.verl_shell import GRAMMAR

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "verl_scripts.md")


def _generator():
  spec = importlib.util.spec_from_file_location(
    "gen_verl_scripts_md", os.path.join(ROOT, "docs", "gen_verl_scripts_md.py")
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_the_checked_in_page_is_the_generator_output():
  with open(DOC) as f:
    assert f.read() == _generator().render(), (
      "docs/verl_scripts.md is out of date: run python docs/gen_verl_scripts_md.py"
    )


def test_every_table_key_and_grammar_row_is_on_the_page():
  with open(DOC) as f:
    text = f.read()
  missing = [key for key in verl_compat.TABLE if f"| `{key}` |" not in text]
  assert not missing, missing
  assert all(construct.replace("|", "\\|") in text for construct, _ in GRAMMAR)
  for family in ("Megatron-LM", "vision-language", "multi-turn", "reward manager"):
    assert f"| {family} |" in text, family


def test_every_refusal_family_has_a_reason():
  used = {
    entry.family
    for entry in verl_compat.TABLE.values()
    if isinstance(entry, verl_compat.Refused) or (isinstance(entry, verl_compat.Ignored) and entry.refuse)
  }
  assert used <= set(verl_compat.FAMILIES), used - set(verl_compat.FAMILIES)
