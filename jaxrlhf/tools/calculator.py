"""A safe arithmetic calculator: `{"expression": "(3 + 4) * -2 / 7"}` -> `-2`.

The expression is parsed with `ast` and evaluated by walking the tree, never with `eval`: only numbers (ints and
floats), `+ - * /`, unary `+`/`-` and parentheses are allowed, so `__import__('os')` or `2 ** 10 ** 10` is an
error, not a computation. Every failure (bad syntax, division by zero, an unsupported element, a result too large)
comes back as `Error: ...` text for the policy to read, never as an exception.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from jaxrlhf.tools.base import BaseTool, ToolResponse

MAX_EXPRESSION_CHARS = 1000  # longer input is refused before parsing (deep nesting makes the parser recurse)

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_ALLOWED = "numbers, + - * /, unary minus and parentheses"


class CalculatorError(Exception):
  """The expression is not one the calculator evaluates; the message is what the policy reads."""


def _evaluate(node: ast.AST) -> int | float:
  if isinstance(node, ast.Expression):
    return _evaluate(node.body)
  if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # type(): True is not a number here
    return node.value
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
    return _BINARY[type(node.op)](_evaluate(node.left), _evaluate(node.right))
  if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
    return _UNARY[type(node.op)](_evaluate(node.operand))
  if isinstance(node, (ast.BinOp, ast.UnaryOp)):
    element = f"operator {type(node.op).__name__}"
  elif isinstance(node, ast.Constant):
    element = f"constant {node.value!r}"
  else:
    element = type(node).__name__
  raise CalculatorError(f"unsupported {element}; the calculator takes {_ALLOWED}")


def _format(value: int | float) -> str:
  if isinstance(value, float):
    if not math.isfinite(value):
      raise CalculatorError("the result is too large")
    if value.is_integer() and abs(value) < 1e15:
      return str(int(value))
    return repr(value)
  return str(value)


def calculate(expression: str) -> str:
  """The value of `expression` as text; raises CalculatorError (and only that) when there is none."""
  if len(expression) > MAX_EXPRESSION_CHARS:
    raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
  try:
    tree = ast.parse(expression.strip(), mode="eval")
  except SyntaxError as error:
    raise CalculatorError(f"invalid expression {expression!r} ({error.msg})") from None
  except (RecursionError, MemoryError, ValueError):  # ValueError: a null byte
    raise CalculatorError(f"invalid expression {expression!r}") from None
  try:
    return _format(_evaluate(tree))
  except ZeroDivisionError:
    raise CalculatorError("division by zero") from None
  except (OverflowError, RecursionError, ValueError):  # ValueError: an int too long to print
    raise CalculatorError("the result is too large") from None


class CalculatorTool(BaseTool):
  """Evaluates the `expression` parameter; step reward 0.0. Stateless: the default create and release."""

  async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
    expression = parameters.get("expression")
    if isinstance(expression, (int, float)) and not isinstance(expression, bool):
      expression = str(expression)
    if not isinstance(expression, str):
      return ToolResponse(text="Error: missing 'expression' (a string such as \"(3 + 4) * 2\")"), 0.0, {}
    try:
      return ToolResponse(text=calculate(expression)), 0.0, {}
    except CalculatorError as error:
      return ToolResponse(text=f"Error: {error}"), 0.0, {}
