"""The package's import graph: one way, no cycle (function-level imports count), and the names the config
validates (JAX-free) are the ones the models implement."""

import ast
import pathlib

from jaxrlhf import config as config_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "jaxrlhf"


def _modules() -> dict[str, pathlib.Path]:
  modules = {}
  for path in ROOT.rglob("*.py"):
    name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
    modules[name.removesuffix(".__init__")] = path
  return modules


def _imports(name: str, path: pathlib.Path, modules) -> set[str]:
  """The jaxrlhf modules `name` imports anywhere in its body (`from a.b import c` is a.b.c when that is a module)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("jaxrlhf"):
      found.update(
        f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
      )
    elif isinstance(node, ast.Import):
      found.update(a.name for a in node.names if a.name.startswith("jaxrlhf"))
  return {m for m in found if m in modules and m != name}


def _cycle(graph) -> list[str] | None:
  """One cycle of the directed graph as a path that returns to its start, or None."""
  state = {}  # 1: on the current path, 2: done

  def visit(node, path):
    state[node] = 1
    for dep in sorted(graph[node]):
      if state.get(dep) == 1:
        return path[path.index(dep) :] + [dep]
      if dep not in state and (found := visit(dep, path + [dep])):
        return found
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state and (found := visit(node, [node])):
      return found
  return None


def test_no_import_cycle():
  modules = _modules()
  assert len(modules) > 50
  graph = {name: _imports(name, path, modules) for name, path in modules.items()}
  assert "jaxrlhf.config" in graph["jaxrlhf.models.lora"]  # the parser sees the edges it should
  assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_one():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_config_names_the_remat_policies_the_decoder_implements():
  from jaxrlhf.models import decoder

  assert set(config_lib.REMAT_POLICY_NAMES) == set(decoder.REMAT_POLICIES)
