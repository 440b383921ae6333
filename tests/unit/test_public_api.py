"""The public names: a sorted __all__ whose every name exists (after httpx's
test_exported_members)."""

from __future__ import annotations

import plunder


def test_all_is_sorted_and_unique() -> None:
    assert plunder.__all__ == sorted(plunder.__all__)
    assert len(set(plunder.__all__)) == len(plunder.__all__)


def test_every_exported_name_exists() -> None:
    missing = [name for name in plunder.__all__ if not hasattr(plunder, name)]
    assert missing == []


def test_the_public_classes_and_functions_are_exported() -> None:
    public = {
        name
        for name, value in vars(plunder).items()
        if not name.startswith("_") and (isinstance(value, type) or callable(value))
    }
    assert public - set(plunder.__all__) == set()


def test_every_exported_error_is_a_plunder_error() -> None:
    for name in plunder.__all__:
        value = getattr(plunder, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, plunder.PlunderError), name
