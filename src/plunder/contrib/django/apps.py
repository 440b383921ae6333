"""The Django app: its management commands, and plunder's schema made by ``migrate``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class PlunderConfig(AppConfig):
    name = "plunder.contrib.django"
    label = "plunder"
    verbose_name = "plunder"

    def ready(self) -> None:
        # sent once per app with models (this one has none): the first brings it up to date
        post_migrate.connect(_migrate_plunder, dispatch_uid="plunder.migrate")


def _migrate_plunder(sender: Any, using: str = "default", **kwargs: Any) -> None:
    """``manage.py migrate`` brings plunder's tables up to date too, for every plunder
    backend on the database just migrated (before a request enqueues inside a transaction
    that holds SQLite's write lock)."""
    from plunder.contrib.django import compat
    from plunder.contrib.django.backend import PlunderBackend

    for alias in compat.task_backends.settings:
        backend = compat.task_backends[alias]
        if isinstance(backend, PlunderBackend) and backend.database == using:
            backend.app.store.migrate()
