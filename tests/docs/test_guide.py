"""The user guide states what the code says: the table of task options in the guide is the
one in ``Options``' docstring (the documentation's source, checked against the defaults by
tests/unit/test_options.py)."""

from __future__ import annotations

from plunder.task import Options
from tests.docs.helpers import ROOT

TASKS = ROOT / "docs" / "guide" / "tasks.md"


def table_rows(text: str) -> list[str]:
    """The rows of the Markdown table whose header is ``| option | meaning | default |``."""
    lines = [line.strip() for line in text.splitlines()]
    start = lines.index("| option | meaning | default |")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def test_the_guides_options_table_is_the_docstrings() -> None:
    documented = table_rows(Options.__doc__ or "")
    assert len(documented) == len(Options.__dataclass_fields__) + 1  # and no_retry
    assert table_rows(TASKS.read_text()) == documented
