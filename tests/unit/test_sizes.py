"""Modules under 500 lines, functions under 50: every module and function of plunder, measured
from its source. The allow-lists name what is still over the limit; a new one over it fails,
and an entry that is no longer over it (or no longer exists) must leave its list."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "plunder"
MODULE_LINES = 500  # a module has fewer lines than this
FUNCTION_LINES = 50  # a function (or method), from its def to its last line, fewer than this

# the debt today, with its size when it was written down (none left)
MODULES_OVER: set[str] = set()
FUNCTIONS_OVER: set[str] = set()


def functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """Every function and method under ``node``, nested ones too: (qualified name, lines)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = prefix + child.name
            if not isinstance(child, ast.ClassDef):
                assert child.end_lineno is not None
                yield name, child.end_lineno - child.lineno + 1
            yield from functions(child, name + ".")
        else:
            yield from functions(child, prefix)


def sizes(package: Path) -> tuple[dict[str, int], dict[str, int]]:
    """The lines of every module (``plunder/x.py``) and function (``plunder/x.py::f``)."""
    modules: dict[str, int] = {}
    funcs: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package.parent).as_posix()
        text = path.read_text(encoding="utf-8")
        modules[module] = len(text.splitlines())
        for name, lines in functions(ast.parse(text, filename=str(path))):
            funcs[f"{module}::{name}"] = lines
    return modules, funcs


def over(measured: dict[str, int], limit: int) -> dict[str, int]:
    return {name: lines for name, lines in measured.items() if lines >= limit}


def test_the_measure_sees_modules_methods_and_nested_functions() -> None:
    tree = ast.parse(
        "class A:\n    def f(self):\n        def g():\n            pass\n\n"
        "async def h():\n    return [\n        1,\n    ]\n"
    )
    assert dict(functions(tree)) == {"A.f": 3, "A.f.g": 2, "h": 4}
    modules, funcs = sizes(PACKAGE)
    assert "plunder/__init__.py" in modules and "plunder/store/__init__.py" in modules
    assert any(name.startswith("plunder/app.py::App.") for name in funcs)


def test_no_module_reaches_500_lines_but_those_allowed() -> None:
    modules, _ = sizes(PACKAGE)
    found = over(modules, MODULE_LINES)
    new = {name: lines for name, lines in found.items() if name not in MODULES_OVER}
    assert not new, f"modules of {MODULE_LINES} lines or more (split them): {new}"
    paid = sorted(MODULES_OVER - found.keys())
    assert not paid, f"under {MODULE_LINES} lines or gone: remove from MODULES_OVER: {paid}"


def test_no_function_reaches_50_lines_but_those_allowed() -> None:
    _, funcs = sizes(PACKAGE)
    found = over(funcs, FUNCTION_LINES)
    new = {name: lines for name, lines in found.items() if name not in FUNCTIONS_OVER}
    assert not new, f"functions of {FUNCTION_LINES} lines or more (split them): {new}"
    paid = sorted(FUNCTIONS_OVER - found.keys())
    assert not paid, f"under {FUNCTION_LINES} lines or gone: remove from FUNCTIONS_OVER: {paid}"
