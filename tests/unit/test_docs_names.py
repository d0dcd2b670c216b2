"""Every pyxds name and ``pyxds`` command the docs show exists (round 17).

A new user copies the README's and the docs' Python and command lines first;
nothing else checks them against the package, so a rename leaves the docs
naming what is gone. This reads every ```python block of README.md and
docs/*.md (with ``ast``; a block that is an API sketch rather than Python,
with ``tokenize``) and checks, against the installed package:

* every ``pyxds`` module and name it imports (``import pyxds.x``,
  ``from pyxds.x import y``), and every attribute it takes of them
  (``pyxds.insecure_channel``, ``registry.register`` after
  ``from pyxds.lb import registry``), comments included;
* every keyword argument it passes to a pyxds callable (``bootstrap=``);

and every ``pyxds ...`` command line the pages show (fenced or inline): its
subcommand and each ``--option`` exist in the parser the command runs, and
``python -m pyxds.cli`` has its ``__main__``. The blocks run for real in
tests/unit/test_docs_blocks_run.py and, with a control plane, in the
round 17 report's run (docs/*.md blocks need backends and generated stubs).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import io
import pathlib
import re
import shlex
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest

from pyxds.cli.main import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
_MISSING = object()


@dataclass(frozen=True)
class Block:
    page: str  # "docs/channel.md"
    line: int  # the fence's line, 1-based
    lang: str
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def doc_blocks() -> list[Block]:
    blocks = []
    for path in PAGES:
        page = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(page):
            line = page.count("\n", 0, match.start()) + 1
            rel = str(path.relative_to(ROOT))
            blocks.append(Block(rel, line, match.group(1), match.group(2)))
    return blocks


BLOCKS = doc_blocks()
PYTHON = [b for b in BLOCKS if b.lang == "python"]


# -- resolving a dotted name against the package --------------------------------


def _attribute(obj: Any, name: str) -> Any:
    """``obj.name``, importing ``obj``'s submodule ``name`` if need be; a
    class's dataclass fields and annotated attributes count; ``_MISSING``
    when there is none."""
    value = getattr(obj, name, _MISSING)
    if value is not _MISSING:
        return value
    if isinstance(obj, ModuleType):
        try:
            return importlib.import_module(f"{obj.__name__}.{name}")
        except ModuleNotFoundError:
            return _MISSING
    if isinstance(obj, type) and any(
        name in getattr(k, "__annotations__", {}) for k in obj.__mro__
    ):
        return None  # an instance attribute: exists, nothing further to check
    return _MISSING


def resolve(dotted: str) -> Any:
    """The object ``dotted`` ("pyxds.lb.registry.register") names; raises
    AssertionError naming the first part that does not exist."""
    parts = dotted.split(".")
    obj: Any = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if obj is None:
            return None
        value = _attribute(obj, part)
        if value is _MISSING:
            raise AssertionError(f"{'.'.join(parts[:i])} has no {part!r}")
        obj = value
    return obj


# -- what a block names --------------------------------------------------------


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


class _Names(ast.NodeVisitor):
    """The pyxds names a parsed block uses: ``bound`` maps the block's local
    names to the dotted pyxds names they were imported as (kept across a
    page's blocks, as a reader runs them in order)."""

    def __init__(self, bound: dict[str, str]) -> None:
        self.bound = bound
        self.used: list[str] = []
        self.calls: list[tuple[str, list[str]]] = []

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == "pyxds":
                self.used.append(alias.name)
                if alias.asname:
                    self.bound[alias.asname] = alias.name
                else:
                    self.bound["pyxds"] = "pyxds"

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module and node.module.split(".")[0] == "pyxds":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                self.used.append(full)
                self.bound[alias.asname or alias.name] = full

    def _full(self, node: ast.expr) -> str | None:
        dotted = _dotted(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head not in self.bound:
            return None
        return self.bound[head] + ("." + rest if rest else "")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        full = self._full(node)
        if full is not None:
            self.used.append(full)
        else:
            self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        full = self._full(node.func)
        if full is not None:
            keywords = [k.arg for k in node.keywords if k.arg is not None]
            self.calls.append((full, keywords))
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        # ``x = pyxds.something`` rebinding a bound name unbinds it.
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.bound.pop(target.id, None)
        self.generic_visit(node)


def _sketch_names(text: str) -> Iterator[str]:
    """The ``pyxds.a.b`` chains of a block that is not Python (an API
    sketch): NAME tokens joined by dots, strings left out."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)]
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.NAME and tok.string == "pyxds":
            if i and tokens[i - 1].string == ".":
                continue
            parts = ["pyxds"]
            j = i + 1
            while (
                j + 1 < len(tokens)
                and tokens[j].string == "."
                and tokens[j + 1].type == tokenize.NAME
            ):
                parts.append(tokens[j + 1].string)
                j += 2
            yield ".".join(parts)


def _comment_names(text: str) -> Iterator[str]:
    """``pyxds.a.b`` named in the block's comments (``# or: pyxds.x(...)``)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            yield from re.findall(r"\bpyxds(?:\.\w+)+", tok.string)


def block_names() -> dict[str, tuple[list[str], list[tuple[str, list[str]]]]]:
    """``"page:line"`` -> (dotted pyxds names used, (callable, keywords) calls)."""
    found = {}
    bound: dict[str, str] = {}
    page = None
    for block in PYTHON:
        if block.page != page:
            page, bound = block.page, {}
        try:
            tree = ast.parse(block.text)
        except SyntaxError:
            found[str(block)] = ([*_sketch_names(block.text)], [])
            continue
        names = _Names(bound)
        names.visit(tree)
        found[str(block)] = ([*names.used, *_comment_names(block.text)], names.calls)
    return found


NAMES = block_names()


def test_the_docs_python_blocks_are_found():
    """The discovery cannot silently find nothing."""
    assert len(PYTHON) >= 30
    assert {"README.md", "docs/lb-policies.md", "docs/architecture.md"} <= {b.page for b in PYTHON}
    assert "pyxds.insecure_channel" in NAMES[str(PYTHON[0])][0]


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_every_pyxds_name_a_docs_block_uses_exists(block):
    used, _ = NAMES[str(block)]
    missing = []
    for name in used:
        try:
            resolve(name)
        except AssertionError as e:
            missing.append(f"{name}: {e}")
    assert not missing, f"{block} names what pyxds does not have: {missing}"


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_every_keyword_a_docs_block_passes_to_pyxds_is_accepted(block):
    _, calls = NAMES[str(block)]
    wrong = []
    for name, keywords in calls:
        try:
            target = resolve(name)
        except AssertionError:
            continue  # reported by the test above
        if not callable(target) or getattr(builtins, name.rsplit(".", 1)[-1], None) is target:
            continue
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):
            continue
        params = signature.parameters
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            continue
        wrong += [f"{name}({k}=)" for k in keywords if k not in params]
    assert not wrong, f"{block} passes keywords pyxds does not take: {wrong}"


# -- the command lines ----------------------------------------------------------


def command_lines() -> list[tuple[str, list[str]]]:
    """``("page:line", argv after 'pyxds')`` for every command line the pages
    show: lines of non-Python fences and inline code spans starting with
    ``pyxds `` (placeholders ``[...]`` and ``...`` dropped)."""
    found = []
    inline = re.compile(r"`pyxds ([^`]*)`")
    for path in PAGES:
        rel = str(path.relative_to(ROOT))
        lines = path.read_text(encoding="utf-8").split("\n")
        fenced = None
        for n, line in enumerate(lines, 1):
            if line.startswith("```"):
                fenced = None if fenced is not None else line[3:].strip()
                continue
            if fenced is not None and fenced != "python":
                command = line.strip()
                output = re.match(r"pyxds( \w+)?: ", command)  # what a command prints
                if command.startswith("pyxds ") and not output:
                    found.append((f"{rel}:{n}", _argv(command[len("pyxds ") :])))
            elif fenced is None:
                found += [(f"{rel}:{n}", _argv(m)) for m in inline.findall(line)]
    return found


def _argv(command: str) -> list[str]:
    command = command.split(" #", 1)[0].replace("[", " ").replace("]", " ")
    return [w for w in shlex.split(command) if w not in ("...",) and not w.endswith("...")]


COMMANDS = command_lines()


def test_the_docs_command_lines_are_found():
    assert len(COMMANDS) >= 20
    assert ["demo", "--no-live"] in [argv for _, argv in COMMANDS]


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_pyxds_command_line_the_docs_show_exists(where, argv):
    parser = build_parser()
    top = {s for a in parser._actions for s in a.option_strings}
    (commands,) = [a for a in parser._actions if a.choices and isinstance(a.choices, dict)]
    words = [w for w in argv if not w.startswith("-")]
    if not words:  # pyxds --version / --help
        assert all(w.split("=")[0] in top for w in argv), f"{where}: {argv}"
        return
    assert words[0] in commands.choices, f"{where}: no subcommand {words[0]!r}"
    sub = commands.choices[words[0]]
    options = {s for a in sub._actions for s in a.option_strings}
    unknown = [w for w in argv if w.startswith("--") and w.split("=")[0] not in options]
    assert not unknown, f"{where}: 'pyxds {words[0]}' has no {unknown}"


def test_python_dash_m_pyxds_cli_the_docs_show_runs_the_command():
    (where,) = [
        f"{p.name}" for p in PAGES if "python -m pyxds.cli" in p.read_text(encoding="utf-8")
    ]
    assert where == "cli.md"
    assert importlib.util.find_spec("pyxds.cli.__main__") is not None
    assert "`python -m pyxds ...`" in (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert importlib.util.find_spec("pyxds.__main__") is not None
