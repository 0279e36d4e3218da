"""Reading a verl run script without running it: the part of bash that verl's run scripts use.

verl's examples and recipes are bash: variables at the top (`max_response_length=$((1024 * 20))`,
`NNODES=${NNODES:-16}`, arrays `DATA=( data.train_files=... )`), `if [ "$mode" = async ]` switches, and one
`python3 -m verl.trainer.main_ppo key=value ...` command. `read_script` runs the assignments and tests in
order (it starts no program) and returns that command's arguments.

What cannot be known when reading stays shell text for the user's shell (`$SLURM_JOB_NUM_NODES`,
`$(nproc)`, `$((8 * NNODES))` with NNODES unset) and is marked so (`Word.shell`). What cannot be read (a
variable set in a loop, or under an `if` whose test needs the shell, and then used by the command;
`${!name}`; an unclosed quote) is an error naming the script line: a setting is never dropped.
`GRAMMAR` says what is read, for docs/verl_scripts.md.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import os
import posixpath
import re
from collections.abc import Iterator

from jaxrlhf.errors import UserError

# The verl programs whose command lines translate, and others named in a clear refusal.
ENTRY_POINTS = ("verl.trainer.main_ppo", "recipe.dapo.main_dapo", "recipe.dapo.src.main_dapo")
OTHER_PROGRAMS = {
  "verl.trainer.main_generation": "verl's offline generation (no training): not a PPO run",
  "verl.trainer.fsdp_sft_trainer": "verl's SFT trainer: jaxrlhf trains with RL only",
  "verl.trainer.sft_trainer": "verl's SFT trainer: jaxrlhf trains with RL only",
  "verl.trainer.main_eval": "verl's offline evaluation: not a PPO run",
}

GRAMMAR = [
  (
    "line continuations, comments, `;` `&&` `||` `|` `&`, redirections (`2>&1 | tee log`), here-documents",
    "read as bash reads them; only the verl command's own words count",
  ),
  (
    "`NAME=value`, `export` / `declare` / `local` / `readonly NAME=value`, `NAME+=value`, `unset NAME`",
    "set in order, as bash does",
  ),
  ("`'single'` and `\"double\"` quotes, `\\` escapes", "removed as bash removes them"),
  (
    "`$NAME`, `${NAME}`, `${NAME:-default}` `${NAME-default}` `${NAME:=default}` `${NAME:+alt}`",
    "the script's value, else the environment's (when reading), else the default",
  ),
  (
    "`${#NAME}`, `${NAME:offset:length}`, `${NAME/pat/rep}` `${NAME//pat/rep}`, `${NAME#pat}` `${NAME##pat}` "
    "`${NAME%pat}` `${NAME%%pat}`, `${NAME^^}` `${NAME,,}`",
    "computed as bash computes them",
  ),
  ("`$((arithmetic))` with inner parentheses, `+ - * / % **`, comparisons", "computed (integers, as bash)"),
  (
    "arrays `NAME=( a=1 b=2 )` over several lines, `NAME+=( ... )`, `NAME[i]=v`, `\"${NAME[@]}\"`, "
    "`\"${NAME[@]:offset:length}\"`, `${NAME[*]}`, `${NAME[i]}`, `${#NAME[@]}`",
    "expanded as bash expands them, one word per element",
  ),
  ("unquoted `$NAME` holding several `key=value` words", "split into words, as bash splits them"),
  ("`$(basename ...)`, `$(dirname ...)`, `$(echo ...)` of known values", "computed"),
  (
    "a variable neither the script nor the environment sets (`$SLURM_JOB_NUM_NODES`), other `$(command)`",
    "left to your shell: the printed command holds it, and train.py translates what depends on it when it runs",
  ),
  (
    "`if` / `elif` / `else` and `test && command` / `||` on `[ ]`, `[[ ]]`, `test`, `(( ))` of known values "
    "(`=`, `==`, `!=`, `-z`, `-n`, `-eq` ... `-ge`, `!`, `&&`, `||`); `exit`",
    "the branch bash would take; other "
    "commands are taken to succeed (`cd dir && python3 -m verl...`); reading stops at `exit`",
  ),
  (
    "a test on anything else (`[ -f file ]`, a command's status), `for` / `while` / `case` bodies, functions",
    "an error naming the line, if the verl command is inside one or uses a variable set there",
  ),
  (
    "`\"$@\"`, `\"${@:2}\"`, `$*` after the verl command; `${1:-default}`",
    "reported: the script's own arguments are added by hand (the reader reads none: `$1` is its default)",
  ),
  (
    "`\\ ` before a space rather than the line's end (`key=v \\  # comment`)",
    "an error naming the line: bash ends the command there and passes ' ' to verl, which refuses it",
  ),
  ("`${!NAME}`, an unclosed quote or bracket, two verl commands", "an error naming the line"),
]


class ScriptError(UserError):
  """A verl script the reader cannot read: the message names the script and line."""


@dataclasses.dataclass(frozen=True)
class _Seg:
  """A piece of an expanded word: `shell` = text left verbatim for the user's shell; `split` = from an
  unquoted expansion (bash splits it into words at whitespace)."""

  text: str
  shell: bool = False
  split: bool = False


class Word(str):
  """A word of the verl command as bash would pass it; `shell` is its double-quoted form (contents only)
  when part of it is left to the user's shell, else None. `only_shell`: all of it is (`$EXTRA_ARGS`);
  `unquoted`: all of it is, unquoted (bash splits it into several words when it runs)."""

  shell: str | None
  only_shell: bool
  unquoted: bool

  def __new__(cls, segs: list[_Seg]):
    word = super().__new__(cls, "".join(seg.text for seg in segs))
    word.shell = (
      "".join(seg.text if seg.shell else _double_quote_escape(seg.text) for seg in segs)
      if any(seg.shell for seg in segs)
      else None
    )
    word.only_shell = any(seg.shell for seg in segs) and all(seg.shell or not seg.text for seg in segs)
    word.unquoted = word.only_shell and all(seg.split for seg in segs if seg.shell)
    return word


def _double_quote_escape(text: str) -> str:
  return re.sub(r'(["\\$`])', r"\\\1", text)


@dataclasses.dataclass(frozen=True)
class _Poison:
  """A variable the reader cannot know: set at `line` under a construct it does not run (`why`)."""

  line: int
  why: str


class _PoisonUsed(Exception):
  def __init__(self, name: str, poison: _Poison):
    super().__init__(name)
    self.name, self.poison = name, poison


class _Unsupported(Exception):
  """A construct the reader cannot read (the message says which); `line` where known, else the caller's."""

  def __init__(self, message: str, line: int | None = None):
    super().__init__(message)
    self.line = line


_EVALUATION_ERRORS = (_Unsupported, ValueError, SyntaxError, ZeroDivisionError, IndexError, RecursionError)


# ----- lexing: the script's text -> simple commands of raw words ---------------------------------------


@dataclasses.dataclass
class _Command:
  words: list[str]  # raw words, quotes and `$...` as written
  line: int  # the line of its first word
  op: str  # what ended it: "\n", ";", "&&", "||", "|", "&", ";;" or "" (end of text)
  lines: list[int] = dataclasses.field(default_factory=list)  # each word's line


_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN = re.compile(rf"({_NAME})(\[[^\]]*\])?(\+?)=(.*)", re.S)
_REDIRECT = re.compile(r"&?(?:<<<|<<-|<<|>>|<>|>\||<&|>&|<|>)")


class _Lexer:
  def __init__(self, text: str, first_line: int = 1):
    self.text, self.i, self.line = text, 0, first_line

  def error(self, line: int, message: str):
    return _Unsupported(message, line)

  def scan_balanced(self, start: int, open_char: str, close_char: str) -> int:
    """End (exclusive) of the bracketed text opening at `start`, skipping quotes, escapes and comments."""
    text, depth, j, line = self.text, 0, start, self.line
    at_word_start = True
    while j < len(text):
      c = text[j]
      if c == "\\":
        j += 2
        continue
      if c == "'":
        k = text.find("'", j + 1)
        if k < 0:
          raise self.error(line, "unclosed ' quote")
        line += text.count("\n", j, k)
        j = k + 1
        continue
      if c == '"':
        k = self.dquote_end(j)
        line += text.count("\n", j, k)
        j = k
        continue
      if c == "#" and at_word_start and open_char == "(" and j > start:
        k = text.find("\n", j)
        j = len(text) if k < 0 else k
        continue
      if c == open_char:
        depth += 1
      elif c == close_char:
        depth -= 1
        if depth == 0:
          return j + 1
      elif c == "\n":
        line += 1
      at_word_start = c in " \t\n(;|&"
      j += 1
    raise self.error(self.line, f"unclosed {open_char!r}")

  def dquote_end(self, start: int) -> int:
    """End (exclusive) of the double-quoted string opening at `start`."""
    text, j = self.text, start + 1
    while j < len(text):
      c = text[j]
      if c == "\\":
        j += 2
      elif c == '"':
        return j + 1
      elif text.startswith("$(", j):
        j = self.scan_balanced(j + 1, "(", ")")
      elif text.startswith("${", j):
        j = self.scan_balanced(j + 1, "{", "}")
      elif c == "`":
        k = text.find("`", j + 1)
        if k < 0:
          raise self.error(self.line, "unclosed ` quote")
        j = k + 1
      else:
        j += 1
    raise self.error(self.line, 'unclosed " quote')

  def read_word(self) -> str:
    """The raw word starting at the cursor (the cursor moves past it)."""
    text, start = self.text, self.i
    while self.i < len(text):
      c = text[self.i]
      if c in " \t\r\n;&|<>":
        break
      if c == "\\":
        if text.startswith("\n", self.i + 1):
          break
        self.i += 2
      elif c == "'":
        k = text.find("'", self.i + 1)
        if k < 0:
          raise self.error(self.line, "unclosed ' quote")
        self.line += text.count("\n", self.i, k)
        self.i = k + 1
      elif c == '"':
        k = self.dquote_end(self.i)
        self.line += text.count("\n", self.i, k)
        self.i = k
      elif c == "$" and text.startswith(("$(", "${"), self.i):
        open_char, close_char = ("(", ")") if text[self.i + 1] == "(" else ("{", "}")
        k = self.scan_balanced(self.i + 1, open_char, close_char)
        self.line += text.count("\n", self.i, k)
        self.i = k
      elif c == "`":
        k = text.find("`", self.i + 1)
        if k < 0:
          raise self.error(self.line, "unclosed ` quote")
        self.line += text.count("\n", self.i, k)
        self.i = k + 1
      elif c == "(" and _ASSIGN.fullmatch(text[start : self.i] + "x") and text[self.i - 1] == "=":
        k = self.scan_balanced(self.i, "(", ")")  # an array: NAME=( ... ) over any number of lines
        self.line += text.count("\n", self.i, k)
        self.i = k
      else:
        self.i += 1
    return text[start : self.i]

  def commands(self) -> Iterator[_Command]:
    text = self.text
    words: list[str] = []
    lines: list[int] = []
    line = self.line
    heredocs: list[tuple[str, bool]] = []
    in_test = False  # inside [[ ]]: && || < > are words

    def command(op):
      nonlocal words, lines
      found = _Command(words, line, op, lines) if words else None
      words, lines = [], []
      return found

    while self.i < len(text):
      c = text[self.i]
      if c == "\\" and text.startswith("\n", self.i + 1):
        self.i += 2
        self.line += 1
        continue
      if c == "\\" and text.startswith("\r\n", self.i + 1):
        self.i += 3
        self.line += 1
        continue
      if c in " \t\r":
        self.i += 1
        continue
      if c == "#":
        end = text.find("\n", self.i)
        self.i = len(text) if end < 0 else end
        continue
      if c == "\n":
        self.i += 1
        found = command("\n")
        if found:
          yield found
        self.line += 1
        for delimiter, strip in heredocs:
          self.skip_heredoc(delimiter, strip)
        heredocs = []
        continue
      if in_test and text.startswith(("&&", "||", "<", ">"), self.i):
        if not words:
          line = self.line
        op = text[self.i : self.i + 2] if text.startswith(("&&", "||"), self.i) else c
        words.append(op)
        lines.append(self.line)
        self.i += len(op)
        continue
      redirect = _REDIRECT.match(text, self.i)
      if redirect:
        self.i = redirect.end()
        if redirect.group().endswith("&") and re.match(r"\d+-?|-", text[self.i :]):
          self.i += re.match(r"\d+-?|-", text[self.i :]).end()
          continue
        while self.i < len(text) and text[self.i] in " \t":
          self.i += 1
        target = self.read_word()
        if redirect.group() in ("<<", "<<-"):
          heredocs.append((re.sub(r"[\"'\\]", "", target), redirect.group() == "<<-"))
        continue
      if c in ";&|":
        op = text[self.i : self.i + 2] if text.startswith(("&&", "||", ";;", "|&"), self.i) else c
        self.i += len(op)
        found = command(op)
        if found:
          yield found
        continue
      if not words:
        line = self.line
      word_line = self.line
      word = self.read_word()
      if re.fullmatch(r"\d+", word) and self.i < len(text) and text[self.i] in "<>":
        continue  # a file descriptor: `2>&1`
      in_test = (in_test or word == "[[") and word != "]]"
      words.append(word)
      lines.append(word_line)
    found = command("")
    if found:
      yield found

  def skip_heredoc(self, delimiter: str, strip: bool) -> None:
    text = self.text
    while self.i < len(text):
      end = text.find("\n", self.i)
      end = len(text) if end < 0 else end
      body_line = text[self.i : end]
      self.i = min(end + 1, len(text))
      self.line += 1
      if (body_line.lstrip("\t") if strip else body_line) == delimiter:
        return


def _raw_words(text: str) -> list[str]:
  """The raw words of `text` (an array's inside, a `$(...)`'s command), ignoring what separates them."""
  return [word for command in _Lexer(text).commands() for word in command.words]


# ----- expansion and execution -------------------------------------------------------------------------


@dataclasses.dataclass
class _Frame:
  kind: str  # if | loop | case | function | group | and-or (`test && command`)
  line: int
  state: str  # run | skip | unknown
  decided: bool | None = False  # if: a branch was taken (True), none yet (False), cannot tell (None)


class _Exit(Exception):
  """`exit` outside any branch: bash stops reading the script there."""


@dataclasses.dataclass
class Script:
  """The verl command of a run script, as bash would run it."""

  path: str
  line: int  # the command's line
  program: str  # the verl module (or main_ppo.py path) it runs
  overrides: list[Word]  # its key=value words
  hydra_args: list[Word]  # --config-path / --config-name (Hydra's base config)
  passthrough: list[Word]  # bare words left to the shell ($EXTRA_ARGS): more overrides at run time
  script_args: bool  # "$@" / $*: the script passes its own arguments on
  missing: set[str]  # the shell variables its overrides leave to the user's shell


class _Shell:
  """Variables and the control-flow stack of a script being read; runs no program."""

  def __init__(self, env: dict[str, str], path: str):
    self.env = env
    self.path = path
    self.vars: dict[str, list[list[_Seg]] | list[_Seg] | _Poison] = {}
    self.arrays: set[str] = set()
    self.frames: list[_Frame] = []
    self.pending: tuple[str, list[_Command]] | None = None  # an if/elif/while test awaiting then/do
    self.pending_function = False
    self.commands: list[tuple[int, list[Word], str]] = []  # (line, words, program) of verl commands
    self.missing: set[str] = set()
    self.script_args = False
    self.line = 0
    # `a && b`, `a || b`: the last command's exit status (tests are computed, set-up commands such as cd or
    # mkdir are taken to succeed, as `set -e` scripts assume; None: only the shell knows) and what followed it.
    self.status: bool | None = True
    self.after = "\n"

  # --- errors ---
  def error(self, message: str, line: int | None = None) -> ScriptError:
    return ScriptError(
      f"{self.path}:{line or self.line}: {message}", hint="docs/verl_scripts.md lists what a verl script may contain"
    )

  def state(self) -> str:
    states = [frame.state for frame in self.frames]
    return "skip" if "skip" in states else "unknown" if "unknown" in states else "run"

  # --- variables ---
  def lookup(self, name: str):
    """A variable's value (segments, or a list of elements for an array), or None when unset."""
    if name in self.vars:
      value = self.vars[name]
      if isinstance(value, _Poison):
        raise _PoisonUsed(name, value)
      return value
    if name in self.env:
      return [_Seg(self.env[name])]
    return None

  def scalar(self, name: str):
    value = self.lookup(name)
    if value is not None and name in self.arrays:
      return value[0] if value else []
    return value

  # --- expansion ---
  def fields(self, raw: str, in_dquote: bool = False) -> list[list[_Seg]]:
    """`raw` expanded into fields (bash's words before splitting; `"${A[@]}"` gives one per element)."""
    fields: list[list[_Seg]] = [[]]
    i = 0
    if not in_dquote and raw.startswith("~") and (len(raw) == 1 or raw[1] == "/"):
      home = self.lookup("HOME")
      fields[-1].append(_Seg("".join(s.text for s in home) if home is not None else "~"))
      i = 1
    while i < len(raw):
      c = raw[i]
      if c == "'" and not in_dquote:
        end = raw.index("'", i + 1)
        fields[-1].append(_Seg(raw[i + 1 : end]))
        i = end + 1
      elif c == '"' and not in_dquote:
        end = _Lexer(raw).dquote_end(i)
        inner_raw = raw[i + 1 : end - 1]
        inner = self.fields(inner_raw, in_dquote=True)
        if not _ALL_ELEMENTS.fullmatch(inner_raw):
          fields[-1].append(_Seg(""))  # "" is a word even when empty ("${A[@]}" of no elements is none)
        fields[-1].extend(inner[0])
        fields.extend(inner[1:])
        i = end
      elif c == "\\":
        following = raw[i + 1 : i + 2]
        keep = in_dquote and following not in ('"', "\\", "$", "`", "\n")
        fields[-1].append(_Seg(("\\" if keep else "") + (following if following != "\n" else "")))
        i += 2
      elif c == "$" or c == "`":
        end = _dollar_end(raw, i)
        expanded = self.dollar(raw[i:end], in_dquote)
        if expanded:
          fields[-1].extend(expanded[0])
          fields.extend(expanded[1:])
        i = end
      else:
        fields[-1].append(_Seg(c))
        i += 1
    return fields

  def split(self, raw: str) -> list[list[_Seg]]:
    """A command word expanded and split as bash splits it: the segments of each resulting word."""
    out = []
    for field in self.fields(raw):
      current: list[_Seg] = []
      content = False
      for seg in field:
        if not seg.split or seg.shell:
          current.append(seg)
          content = True
          continue
        for k, part in enumerate(re.split(r"[ \t\n]+", seg.text)):
          if k > 0:
            if content:
              out.append(current)
            current, content = [], False
          if part:
            current.append(_Seg(part))
            content = True
      if content:
        out.append(current)
    return out

  def words(self, raw: str) -> list[Word]:
    """A command word as bash passes it on: possibly none, possibly several."""
    return [Word(segs) for segs in self.split(raw)]

  def value(self, raw: str) -> list[_Seg]:
    """An assignment's value: expanded, not split (several fields join with spaces, as bash joins them)."""
    out: list[_Seg] = []
    for k, field in enumerate(self.fields(raw)):
      out += ([_Seg(" ")] if k else []) + [_Seg(seg.text, seg.shell) for seg in field]
    return out

  def text(self, raw: str) -> str:
    """`raw` expanded to plain text; raises _Unsupported when part of it is left to the shell."""
    segs = self.value(raw)
    if any(seg.shell for seg in segs):
      raise _Unsupported("needs a value only the shell knows")
    return "".join(seg.text for seg in segs)

  def dollar(self, piece: str, quoted: bool) -> list[list[_Seg]]:
    """The fields of one `$...` / backquote expression."""

    def verbatim(text=piece):
      return [[_Seg(text, shell=True, split=not quoted)]]

    if piece.startswith("$((") and piece.endswith("))"):
      return self.arithmetic(piece[3:-2])
    if piece.startswith("$(") or piece.startswith("`"):
      return self.substitution(piece[2:-1] if piece.startswith("$(") else piece[1:-1], quoted)
    if piece.startswith("${"):
      return self.parameter(piece, piece[2:-1], quoted)
    name = piece[1:]
    if name in ("@", "*"):
      self.script_args = True
      return [[]]
    if re.fullmatch(r"\d", name) or name in ("#", "?", "$", "!", "-"):
      return verbatim()
    if not name:
      return [[_Seg("$")]]
    value = self.scalar(name)
    if value is None:
      self.missing.add(name)
      return verbatim()
    return [[_Seg(seg.text, seg.shell, split=not quoted) for seg in value]]

  def arithmetic(self, expression: str) -> list[list[_Seg]]:
    segs = self.value(expression)
    text = "".join(seg.text for seg in segs)
    left_to_shell = any(seg.shell for seg in segs)

    def name(match):  # bash reads a bare name as that variable's value
      nonlocal left_to_shell
      value = self.scalar(match.group(0))
      if value is None:
        self.missing.add(match.group(0))
        left_to_shell = True
        return match.group(0)
      left_to_shell = left_to_shell or any(seg.shell for seg in value)
      return f"({''.join(seg.text for seg in value).strip() or 0})"

    substituted = re.sub(rf"(?<![\w${{]){_NAME}", name, text)
    if left_to_shell:
      return [[_Seg(f"$(({substituted}))", shell=True)]]
    try:
      return [[_Seg(str(_evaluate(substituted)))]]
    except (SyntaxError, ValueError, ZeroDivisionError) as error:
      raise _Unsupported(f"cannot compute $(({expression})): {error}") from None

  def substitution(self, command: str, quoted: bool) -> list[list[_Seg]]:
    words = [word for raw in _raw_words(command) for word in self.words(raw)]
    if words and all(word.shell is None for word in words):
      program, args = words[0], [str(w) for w in words[1:]]
      if program == "basename" and args:
        base = posixpath.basename(args[0].rstrip("/") or "/")
        return [[_Seg(base[: -len(args[1])] if len(args) > 1 and base.endswith(args[1]) else base)]]
      if program == "dirname" and len(args) == 1:
        return [[_Seg(posixpath.dirname(args[0].rstrip("/")) or ".")]]
      if program == "echo":
        return [[_Seg(" ".join(a for a in args if a not in ("-n", "-e")), split=not quoted)]]

    def known(match):  # the script's own variables, which the user's shell does not have
      name = match.group(1) or match.group(2)
      if name in self.vars and not isinstance(self.vars[name], _Poison) and name not in self.arrays:
        return "".join(seg.text for seg in self.vars[name])
      return match.group(0)

    text = re.sub(rf"\$\{{({_NAME})\}}|\$({_NAME})", known, command)
    return [[_Seg(f"$({text})", shell=True, split=not quoted)]]

  def parameter(self, piece: str, inner: str, quoted: bool) -> list[list[_Seg]]:
    def verbatim():
      return [[_Seg(piece, shell=True, split=not quoted)]]

    if inner.startswith("!"):
      raise _Unsupported(f"{piece}: indirect expansion")
    if inner.startswith("#"):  # length
      match = re.fullmatch(rf"#({_NAME})(\[[@*]\])?", inner)
      if not match:
        raise _Unsupported(f"cannot read {piece}")
      value = self.lookup(match.group(1))
      if match.group(2):
        return [
          [
            _Seg(
              str(
                len(value) if value is not None and match.group(1) in self.arrays else (1 if value is not None else 0)
              )
            )
          ]
        ]
      value = self.scalar(match.group(1))
      if value is None or any(seg.shell for seg in value):
        return verbatim()
      return [[_Seg(str(len("".join(seg.text for seg in value))))]]
    match = re.fullmatch(rf"({_NAME}|\d+|[@*])(?:\[([^\]]+)\])?(.*)", inner, re.S)
    if not match:
      raise _Unsupported(f"cannot read {piece}")
    name, index, rest = match.groups()
    if name in ("@", "*"):
      if rest and not _SLICE.fullmatch(rest):
        raise _Unsupported(f"cannot read {piece}: an operation on the script's arguments")
      self.script_args = True  # "${@:2}": some of them; the reader knows none
      return [[]]
    if index is not None:
      value = self.lookup(name)
      elements = (value if name in self.arrays else [value]) if value is not None else []
      if index in ("@", "*"):
        if rest and _SLICE.fullmatch(rest):
          offset, _, length = rest[1:].partition(":")
          start = _evaluate(self.text(offset))
          start = max(len(elements) + start, 0) if start < 0 else start
          stop = len(elements) if not length else start + _evaluate(self.text(length))
          elements = elements[start:stop]
        elif rest:
          raise _Unsupported(f"cannot read {piece}: an operation on a whole array")
        if index == "@" and quoted:
          return [list(element) for element in elements] or [[]]
        joined = []
        for k, element in enumerate(elements):
          joined += ([_Seg(" ", split=not quoted)] if k else []) + [
            _Seg(s.text, s.shell, split=not quoted) for s in element
          ]
        return [joined]
      position = _evaluate(self.text(index)) if not index.isdigit() else int(index)
      value = elements[position] if -len(elements) <= position < len(elements) else None
    else:
      value = self.scalar(name) if not name.isdigit() else None
    if not rest:
      if value is None:
        self.missing.add(name)
        return verbatim()
      return [[_Seg(seg.text, seg.shell, split=not quoted) for seg in value]]
    op = re.match(r":-|:=|:\+|:\?|-|=|\+|\?|//|/|##|#|%%|%|\^\^|\^|,,|,|:", rest)
    if not op:
      raise _Unsupported(f"cannot read {piece}")
    op, argument = op.group(), rest[op.end() :]
    is_set = value is not None
    is_null = not is_set or (all(not seg.shell for seg in value) and not "".join(seg.text for seg in value))
    if op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
      use_default = is_null if op.startswith(":") else not is_set
      if op in (":+", "+"):
        chosen = None if use_default else self.value(argument)
        return [[_Seg(s.text, s.shell, split=not quoted) for s in chosen]] if chosen else [[]]
      if not use_default:
        return [[_Seg(seg.text, seg.shell, split=not quoted) for seg in value]]
      if op in (":?", "?"):
        self.missing.add(name)
        return verbatim()
      default = self.value(argument)
      if op in (":=", "="):
        self.vars[name] = default
      return [[_Seg(s.text, s.shell, split=not quoted) for s in default]]
    if value is None or any(seg.shell for seg in value):
      self.missing.add(name)
      return verbatim()
    text = "".join(seg.text for seg in value)
    if op == ":":
      numbers = argument.split(":")
      offset = _evaluate(self.text(numbers[0]) or "0")
      length = _evaluate(self.text(numbers[1])) if len(numbers) > 1 else None
      text = (
        text[offset:] if length is None else text[offset : offset + length] if length >= 0 else (text[offset:length])
      )
    elif op in ("//", "/"):
      parts = re.split(r"(?<!\\)/", argument, maxsplit=1)
      pattern, replacement = parts[0], parts[1] if len(parts) > 1 else ""
      regex = _glob(self.text(pattern))
      text = re.sub(regex, self.text(replacement).replace("\\", "\\\\"), text, count=0 if op == "//" else 1)
    elif op in ("#", "##", "%", "%%"):
      text = _strip(text, self.text(argument), op)
    else:  # ^^ ^ ,, ,
      text = (
        text.upper()
        if op == "^^"
        else text[:1].upper() + text[1:]
        if op == "^"
        else text.lower()
        if op == ",,"
        else text[:1].lower() + text[1:]
      )
    return [[_Seg(text, split=not quoted)]]

  # --- execution ---
  def run(self, command: _Command) -> None:
    after, self.after = self.after, command.op
    if after in ("&&", "||") and self.pending is None:
      runs = self.status if after == "&&" else (None if self.status is None else not self.status)
      if runs is False:
        return  # skipped; the status stays, so `a && b || c` runs c when a fails
      if runs is None:
        self.frames.append(_Frame("and-or", command.line, "unknown"))
        try:
          self.run_command(command)
        finally:
          self.frames.pop()
        self.status = None
        return
    self.run_command(command)

  def run_command(self, command: _Command) -> None:
    self.line = command.line
    self.status = (
      True if not command.words or command.words[0] in _SUCCEEDS or _ASSIGN.fullmatch(command.words[0]) else None
    )
    words = list(command.words)
    if self.pending is not None:
      kind, parts = self.pending
      if words and words[0] in ("then", "do"):
        self.pending = None
        self.open_block(kind, parts, command.line)
        words = words[1:]
      else:
        parts.append(command)
        return
    if self.pending_function:
      self.pending_function = False
      if words and words[0] == "{":
        words = words[1:]
    if self.frames and self.frames[-1].kind == "case" and words and words[0] != "esac":
      while words and (words[0].endswith(")") or words[0] == "("):  # `pattern)` of a case branch
        words = words[1:]
    while words:
      keyword = words[0]
      if keyword in ("if", "elif", "while", "until"):
        self.pending = (keyword, [_Command(words[1:], command.line, command.op)])
        return
      if keyword == "else":
        frame = self.frame("if", "else")
        frame.state = "skip" if frame.decided else "unknown" if frame.decided is None else "run"
        words = words[1:]
        continue
      if keyword in ("fi", "done", "esac", "}"):
        self.close(keyword)
        words = words[1:]
        continue
      if keyword in ("for", "select"):
        self.pending = ("for", [])
        if self.state() == "run":
          name = words[1] if len(words) > 1 else ""
          self.vars[name] = _Poison(command.line, f"a loop (line {command.line})")
        return
      if keyword == "case":
        self.frames.append(_Frame("case", command.line, "unknown"))
        return
      if keyword == "function" or re.fullmatch(rf"{_NAME}\(\)", keyword) or (len(words) > 1 and words[1] == "()"):
        self.frames.append(_Frame("function", command.line, "unknown"))
        rest = words[1:] if keyword != "function" else words[2:]
        rest = [w for w in rest if w != "()"]
        if rest and rest[0] == "{":
          rest = rest[1:]
        else:
          self.pending_function = True
        words = rest
        continue
      if keyword == "{":
        self.frames.append(_Frame("group", command.line, "run"))
        words = words[1:]
        continue
      break
    if words:  # what is left after the keywords: the command's last words
      self.simple(words, command.line, command.lines[len(command.lines) - len(words) :])

  def open_block(self, kind: str, parts: list[_Command], line: int) -> None:
    if kind in ("for", "while", "until"):
      self.frames.append(_Frame("loop", line, "unknown"))
      return
    result = self.test(parts)
    if kind == "if":
      self.frames.append(_Frame("if", line, _state_of(result), decided=result))
      return
    frame = self.frame("if", "elif")  # elif
    if frame.decided:
      frame.state = "skip"
    elif frame.decided is None or result is None:
      frame.state, frame.decided = "unknown", None
    else:
      frame.state, frame.decided = _state_of(result), result

  def unknown_frame(self) -> str:
    frame = next(f for f in reversed(self.frames) if f.state == "unknown")
    return {
      "if": "an `if` whose test only the shell can decide",
      "loop": "a loop",
      "case": "a `case`",
      "function": "a function",
      "and-or": "a `&&` / `||` whose test only the shell can decide",
    }[frame.kind] + f" (line {frame.line})"

  def frame(self, kind: str, keyword: str) -> _Frame:
    if not self.frames or self.frames[-1].kind != kind:
      raise self.error(f"`{keyword}` without an open `{kind}`")
    return self.frames[-1]

  def close(self, keyword: str) -> None:
    kinds = {"fi": ("if",), "done": ("loop",), "esac": ("case",), "}": ("function", "group")}[keyword]
    if not self.frames or self.frames[-1].kind not in kinds:
      raise self.error(f"`{keyword}` closes nothing")
    self.frames.pop()

  def test(self, parts: list[_Command]) -> bool | None:
    """An if/elif test's outcome: True/False, or None when only the shell could tell."""
    result: bool | None = None
    connector = None
    for part in parts:
      try:
        value = self.simple_test(part.words)
      except (_PoisonUsed, *_EVALUATION_ERRORS):
        value = None
      if connector is None:
        result = value
      elif connector == "&&":
        result = False if result is False or value is False else None if None in (result, value) else True
      else:
        result = True if result is True or value is True else None if None in (result, value) else False
      connector = part.op if part.op in ("&&", "||") else None
    return result

  def simple_test(self, words: list[str]) -> bool | None:
    negate = False
    while words and words[0] == "!":
      negate, words = not negate, words[1:]
    if not words:
      return None
    if words[0] in ("true", ":"):
      result = True
    elif words[0] == "false":
      result = False
    elif words[0] == "[[" and words[-1] == "]]":
      result = self.condition(words[1:-1], double=True)
    elif words[0] == "[" and words[-1] == "]":
      result = self.condition(words[1:-1], double=False)
    elif words[0] == "test":
      result = self.condition(words[1:], double=False)
    elif words[0].startswith("((") and words[-1].endswith("))"):
      expression = " ".join(words)[2:-2]
      result = bool(_evaluate(self.text(expression)))
    else:
      return None  # a command's exit status: only the shell knows
    return None if result is None else result != negate

  def condition(self, words: list[str], double: bool) -> bool | None:
    for joiner in (("||", "-o"), ("&&", "-a")):
      for k, word in enumerate(words):
        if word in joiner:
          left, right = self.condition(words[:k], double), self.condition(words[k + 1 :], double)
          if joiner[0] == "||":
            return True if True in (left, right) else None if None in (left, right) else False
          return False if False in (left, right) else None if None in (left, right) else True
    if words and words[0] == "!":
      inner = self.condition(words[1:], double)
      return None if inner is None else not inner
    if words and words[0] == "(" and words[-1] == ")":
      return self.condition(words[1:-1], double)
    values = [self.text(word) for word in words]
    if len(values) == 1:
      return bool(values[0])
    if len(values) == 2 and values[0] in ("-z", "-n"):
      return (not values[1]) if values[0] == "-z" else bool(values[1])
    if len(values) == 3:
      left, op, right = values
      if op in ("=", "=="):
        return fnmatch.fnmatchcase(left, right) if double and not _quoted(words[2]) else left == right
      if op == "!=":
        return not (fnmatch.fnmatchcase(left, right) if double and not _quoted(words[2]) else left == right)
      if op in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
        a, b = int(left), int(right)
        return {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[op]
      if op == "=~":
        return re.search(right, left) is not None
    return None  # file tests and the like: only the shell knows

  def simple(self, words: list[str], line: int, lines: list[int]) -> None:
    state = self.state()
    if state == "skip":
      return
    if words[0] in ("[", "[[", "test", "true", "false", ":") or words[0].startswith("(("):
      try:
        self.status = self.simple_test(words) if state == "run" else None
      except (_PoisonUsed, *_EVALUATION_ERRORS):
        self.status = None
      return
    if words[0] == "exit" and state == "run":
      raise _Exit()
    program = _program(words)
    if program:
      if state == "unknown" and any(f.state == "unknown" and f.kind != "and-or" for f in self.frames):
        raise self.error(
          f"the verl command is inside {self.unknown_frame()}: the reader cannot tell whether or how often it runs",
          line,
        )
      expanded = []
      for k, (raw, word_line) in enumerate(zip(words, lines)):
        if re.fullmatch(r"(\\[ \t])+", raw):
          ends = (
            (
              ", and the command ends there: bash runs the lines after it as commands of their own (verl never "
              "sees their keys)"
            )
            if k == len(words) - 1
            else ""
          )
          raise self.error(
            f"`\\ ` (a backslash before a space, not before the end of the line) passes {raw[1::2]!r} "
            f"to verl as a word of its own, which verl refuses (no key=value){ends}; delete what "
            "follows the backslash on that line",
            word_line,
          )
        try:
          expanded += self.words(raw)
        except _PoisonUsed as used:
          raise self.error(
            f"the verl command uses ${used.name}, which is set inside {used.poison.why}: the reader "
            "cannot tell its value",
            word_line,
          ) from None
        except _EVALUATION_ERRORS as unsupported:
          raise self.error(str(unsupported), getattr(unsupported, "line", None) or word_line) from None
      self.commands.append((line, expanded, program))
      return
    declare = words[0] in ("export", "declare", "typeset", "local", "readonly")
    assignments = []
    rest = words[1:] if declare else words
    while rest and (
      _ASSIGN.fullmatch(rest[0]) or (declare and (rest[0].startswith("-") or re.fullmatch(_NAME, rest[0])))
    ):
      if _ASSIGN.fullmatch(rest[0]):
        assignments.append(rest[0])
      rest = rest[1:]
    if rest and not declare:
      command = rest[0]
      if state == "run" and command == "unset":
        for name in rest[1:]:
          self.vars.pop(name, None)
          self.arrays.discard(name)
      elif command in ("unset", "read", "let", "mapfile", "readarray") or command.startswith("(("):
        names = [w.split("=")[0] for w in rest[1:] if re.fullmatch(_NAME + "(=.*)?", w)]
        if command.startswith("(("):
          names = re.findall(rf"({_NAME})\s*(?:[-+*/%]?=|\+\+|--)", " ".join(rest))
        for name in names:
          self.vars[name] = _Poison(line, f"`{command}` at line {line}")
      return  # another program (its VAR=value prefix is for it alone)
    for assignment in assignments:
      name = _ASSIGN.fullmatch(assignment).group(1)
      if state == "unknown":
        self.vars[name] = _Poison(line, self.unknown_frame())
        continue
      try:
        self.assign(assignment)
      except _PoisonUsed as used:
        self.vars[name] = used.poison
      except _EVALUATION_ERRORS as unsupported:
        self.vars[name] = _Poison(line, f"an assignment the reader cannot read ({unsupported})")

  def assign(self, assignment: str) -> None:
    name, index, append, raw = _ASSIGN.fullmatch(assignment).groups()
    if raw.startswith("(") and raw.endswith(")") and index is None:
      elements = [
        [_Seg(seg.text, seg.shell) for seg in segs] for inner in _raw_words(raw[1:-1]) for segs in self.split(inner)
      ]
      if append and name in self.arrays:
        elements = list(self.vars[name]) + elements
      self.vars[name] = elements
      self.arrays.add(name)
      return
    value = self.value(raw)
    if index is not None:
      position = int(index[1:-1]) if index[1:-1].isdigit() else _evaluate(self.text(index[1:-1]))
      elements = (
        list(self.vars.get(name, [])) if name in self.arrays else ([self.vars[name]] if name in self.vars else [])
      )
      while len(elements) <= position:
        elements.append([])
      elements[position] = value
      self.vars[name] = elements
      self.arrays.add(name)
      return
    if append:
      old = self.scalar(name) or []
      value = list(old) + value
    if name in self.arrays and not append:
      self.vars[name] = [value] + list(self.vars[name])[1:]
      return
    self.vars[name] = value


# Commands whose success a script takes for granted (`cd "$DIR" && python3 -m verl...`).
_SUCCEEDS = {
  "cd",
  "pushd",
  "popd",
  "mkdir",
  "export",
  "declare",
  "typeset",
  "local",
  "readonly",
  "unset",
  "set",
  "echo",
  "printf",
  "source",
  ".",
  "ulimit",
  "eval",
  "shift",
  "sleep",
  "touch",
  "cp",
  "mv",
  "ln",
  "rm",
  "wait",
  "module",
  "conda",
  "pip",
  "ray",
  "nvidia-smi",
  "trap",
  "umask",
  "hostname",
  "date",
}


def _state_of(result: bool | None) -> str:
  return "unknown" if result is None else "run" if result else "skip"


def _quoted(raw: str) -> bool:
  return raw[:1] in ("'", '"')


# `"$@"`, `"${@:2}"`, `"${A[@]}"`, `"${A[@]:1:2}"`: quoted, yet no word at all when there is no element.
_SLICE = re.compile(r":(?![-=+?])[^:}]+(:[^:}]+)?")  # ${@:offset}, ${A[@]:offset:length} (not ${A:-default})
_ALL_ELEMENTS = re.compile(rf"\$@|\$\{{(@|{_NAME}\[@\])({_SLICE.pattern})?\}}")


def _glob(pattern: str) -> str:
  return fnmatch.translate(pattern).removeprefix("(?s:").removesuffix(")\\Z")


def _strip(text: str, pattern: str, op: str) -> str:
  regex = re.compile(_glob(pattern), re.S)
  spans = range(len(text) + 1)
  if op in ("#", "##"):
    for end in spans if op == "#" else reversed(spans):
      if regex.fullmatch(text[:end]):
        return text[end:]
  else:
    for start in reversed(spans) if op == "%" else spans:
      if regex.fullmatch(text[start:]):
        return text[:start]
  return text


def _dollar_end(raw: str, start: int) -> int:
  """End (exclusive) of the `$...` or backquote expression at `start`."""
  lexer = _Lexer(raw)
  if raw.startswith("`", start):
    return raw.index("`", start + 1) + 1
  if raw.startswith("$(", start):
    return lexer.scan_balanced(start + 1, "(", ")")
  if raw.startswith("${", start):
    return lexer.scan_balanced(start + 1, "{", "}")
  match = re.compile(rf"\$(?:{_NAME}|[@*#?$!\-0-9])").match(raw, start)
  return match.end() if match else start + 1


_ARITHMETIC_OPS = {
  ast.Add: lambda a, b: a + b,
  ast.Sub: lambda a, b: a - b,
  ast.Mult: lambda a, b: a * b,
  ast.Div: lambda a, b: int(a / b) if b else _zero(),
  ast.FloorDiv: lambda a, b: int(a / b),
  ast.Mod: lambda a, b: int(__import__("math").fmod(a, b)) if b else _zero(),
  ast.Pow: lambda a, b: a**b,
  ast.LShift: lambda a, b: a << b,
  ast.RShift: lambda a, b: a >> b,
  ast.BitAnd: lambda a, b: a & b,
  ast.BitOr: lambda a, b: a | b,
  ast.BitXor: lambda a, b: a ^ b,
}
_COMPARE_OPS = {
  ast.Lt: lambda a, b: a < b,
  ast.LtE: lambda a, b: a <= b,
  ast.Gt: lambda a, b: a > b,
  ast.GtE: lambda a, b: a >= b,
  ast.Eq: lambda a, b: a == b,
  ast.NotEq: lambda a, b: a != b,
}


def _zero():
  raise ZeroDivisionError("division by 0")


def _evaluate(expression: str) -> int:
  """bash integer arithmetic on numbers (division truncates toward zero); ValueError for anything else."""
  text = expression.replace("&&", " and ").replace("||", " or ")
  text = re.sub(r"!(?!=)", " not ", text)

  def walk(node):
    if isinstance(node, ast.Expression):
      return walk(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
      return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC_OPS:
      return _ARITHMETIC_OPS[type(node.op)](walk(node.left), walk(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not, ast.Invert)):
      value = walk(node.operand)
      return {ast.USub: -value, ast.UAdd: value, ast.Not: int(not value), ast.Invert: ~value}[type(node.op)]
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE_OPS:
      return int(_COMPARE_OPS[type(node.ops[0])](walk(node.left), walk(node.comparators[0])))
    if isinstance(node, ast.BoolOp):
      values = [walk(v) for v in node.values]
      return int(all(values) if isinstance(node.op, ast.And) else any(values))
    if isinstance(node, ast.IfExp):
      return walk(node.body) if walk(node.test) else walk(node.orelse)
    raise ValueError(f"not integer arithmetic: {expression.strip()!r}")

  text = re.sub(r"(\S+)\s*\?\s*(\S+)\s*:\s*(\S+)", r"(\2 if \1 else \3)", text)
  return walk(ast.parse(text.strip() or "0", mode="eval"))


def _program(raw_words: list[str]) -> str | None:
  """The verl program a command runs (a module or main_ppo.py path), or None for any other command."""
  for k, word in enumerate(raw_words):
    bare = word.strip("'\"")
    if bare in ENTRY_POINTS or bare in OTHER_PROGRAMS or re.search(r"(^|/)verl/trainer/main_ppo\.py$", bare):
      return bare
    if k > 0 and raw_words[k - 1] == "-m" and re.fullmatch(r"verl\.trainer\.main_\w+|recipe\.[\w.]*main_\w+", bare):
      return bare
  return None


def read_script(path: str, env: dict[str, str] | None = None) -> Script:
  """The verl command of a run script with the script's variables resolved (nothing is run).

  `env`: the environment the script sees (default: this process's); variables neither the script nor
  `env` sets are left to the user's shell.
  """
  try:
    with open(path) as f:
      text = f.read()
  except OSError as error:
    raise UserError(f"cannot read verl script {path!r}: {error.strerror}") from None
  shell = _Shell(dict(os.environ if env is None else env), path)
  try:
    for command in _Lexer(text).commands():
      shell.run(command)
  except _Exit:
    shell.frames = []
  except _Unsupported as unsupported:
    raise shell.error(str(unsupported), unsupported.line) from None
  if shell.pending is not None or shell.frames:
    opened = shell.frames[-1].line if shell.frames else shell.line
    raise shell.error("an `if`, loop or block is never closed", opened)
  if not shell.commands:
    raise UserError(
      f"verl script {path!r} has no `python3 -m verl.trainer.main_ppo` command",
      hint=f"looked for {', '.join(ENTRY_POINTS)}",
    )
  if len(shell.commands) > 1:
    lines = ", ".join(str(line) for line, _, _ in shell.commands)
    raise shell.error(
      f"the script runs verl {len(shell.commands)} times (lines {lines}): translate one command "
      "at a time (copy it into a script of its own)",
      shell.commands[1][0],
    )
  line, words, program = shell.commands[0]
  if program in OTHER_PROGRAMS or (program not in ENTRY_POINTS and not program.endswith("main_ppo.py")):
    reason = OTHER_PROGRAMS.get(program, "another verl program")
    raise shell.error(
      f"the script runs {program} ({reason}): only verl.trainer.main_ppo command lines "
      "(and DAPO's main_dapo) translate to jaxrlhf",
      line,
    )
  start = next(k for k, word in enumerate(words) if word == program or word.endswith(program))
  overrides, hydra, passthrough = [], [], []
  args = iter(words[start + 1 :])
  for word in args:
    if word.startswith(("--config-path", "--config-name", "--config-dir", "-cp", "-cn", "-cd")):
      hydra.append(word)
      if "=" not in word:
        following = next(args, None)
        if following is not None:
          hydra.append(following)
    elif re.match(r"\+{0,2}[A-Za-z_][\w.]*=|~", word):
      overrides.append(word)
    elif word.only_shell:
      passthrough.append(word)  # only the shell knows: perhaps several key=value words
    else:
      raise shell.error(
        f"cannot read {str(word)!r} in the verl command: expected key=value (Hydra's override "
        "syntax) or --config-path/--config-name",
        line,
      )
  missing = {
    name for name in shell.missing if any(re.search(rf"\b{name}\b", w.shell or "") for w in overrides + passthrough)
  }
  return Script(path, line, program, overrides, hydra, passthrough, shell.script_args, missing)
