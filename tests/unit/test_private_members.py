"""The store's modules reach no private member of another object: what one part needs of
another (the turn pipe of its PostgreSQL store, say) is handed to it, never taken from
behind its back. ``self``, ``cls`` and ``super()`` are the object's own; a namedtuple's
``_replace`` and ``_asdict`` are its public API."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

STORE = Path(__file__).resolve().parents[2] / "src" / "plunder" / "store"
PUBLIC = frozenset({"_replace", "_asdict", "_fields", "_make"})  # namedtuple's own API


def reached(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every ``x._name`` in ``tree`` where ``x`` is not the object itself."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr in PUBLIC:
            continue
        if not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
            continue
        yield node.lineno, ast.unparse(node)


def test_the_measure_sees_another_objects_private_members_only() -> None:
    tree = ast.parse(
        "self._a; cls._b; super()._c(); row._replace(x=1); a.__class__\n"
        "store._pool_size; self._store._get_pool().putconn(c)\n"
    )
    assert [text for _, text in reached(tree)] == [
        "store._pool_size",
        "self._store._get_pool",
    ]


def test_no_store_module_reaches_a_private_member_of_another_object() -> None:
    found = [
        f"{path.relative_to(STORE.parent)}:{line}: {text}"
        for path in sorted(STORE.rglob("*.py"))
        for line, text in reached(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not found, "private members reached from outside their object:\n" + "\n".join(found)
