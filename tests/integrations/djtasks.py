"""Django tasks for tests/integrations/test_django_backend.py (module level, as the
framework requires); imported once Django is configured."""

from __future__ import annotations

from typing import Any

from plunder.contrib.django import compat

ran: list[str] = []


@compat.tasks.task
def add(a: int, b: int) -> int:
    ran.append(f"add {a} {b}")
    return a + b


@compat.tasks.task(priority=-5)
def noted(label: str) -> str:
    ran.append(label)
    return label


@compat.tasks.task
def fails(message: str) -> None:
    raise ValueError(message)


@compat.tasks.task(takes_context=True)
def with_context(context: Any, tag: str) -> dict[str, Any]:
    return {"id": context.task_result.id, "attempt": context.attempt, "tag": tag}


@compat.tasks.task(queue_name="emails")
async def shout(word: str) -> str:
    return word.upper()
