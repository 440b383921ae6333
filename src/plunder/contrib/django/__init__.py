"""Django's tasks framework over plunder: ``TASKS = {"default": {"BACKEND":
"plunder.contrib.django.PlunderBackend"}}`` and ``"plunder.contrib.django"`` in
``INSTALLED_APPS`` (for ``manage.py plunder_worker`` and ``manage.py plunder``). See
docs/guide/django.md."""

from __future__ import annotations

from typing import Any

__all__ = ["PlunderBackend", "current_context"]


def __getattr__(name: str) -> Any:  # the backend imports Django's settings: only when asked
    if name in __all__:
        from plunder.contrib.django import backend

        return getattr(backend, name)
    raise AttributeError(name)
