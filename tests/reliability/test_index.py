"""The index in tests/reliability/README.md stays true: every test it names exists, and every test of this folder
is named there (a case without a test, or a test without its case, fails here)."""

import ast
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _tests_of(path):
  with open(path) as f:
    tree = ast.parse(f.read())
  return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def _named():
  """{(file, test)} named by the index: `file::test`, and `, ::test` for another test of the file before it."""
  named = set()
  with open(os.path.join(HERE, "README.md")) as f:
    lines = f.read().splitlines()
  for line in lines:
    path = None
    for match in re.finditer(r"((?:tests/[\w/]+/)?test_\w+\.py)?::(\w+)", line):
      path = match.group(1) or path
      if path is not None:
        named.add((path if "/" in path else f"tests/reliability/{path}", match.group(2)))
  return named


def test_every_test_the_index_names_exists():
  named = _named()
  assert len(named) >= 25  # the parse found them
  missing = [(path, name) for path, name in sorted(named) if name not in _tests_of(os.path.join(ROOT, path))]
  assert not missing


def test_every_test_of_this_folder_is_in_the_index():
  named = _named()
  for file in sorted(os.listdir(HERE)):
    if file.startswith("test_") and file.endswith(".py") and file != "test_index.py":
      for name in _tests_of(os.path.join(HERE, file)):
        assert (f"tests/reliability/{file}", name) in named, (file, name)
