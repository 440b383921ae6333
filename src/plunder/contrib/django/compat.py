"""Django's tasks framework: ``django.tasks`` (Django 6) where it exists, else the
``django-tasks`` backport on Django 5.2. Both define the same names, but for the
exceptions that Django 6 renamed (``InvalidTaskError`` became ``InvalidTask``)."""

from __future__ import annotations

import importlib
from types import ModuleType


def _first(*names: str) -> ModuleType:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(
        f"plunder.contrib.django needs Django's tasks framework: Django 6 (django.tasks) or "
        f"the django-tasks backport on Django 5.2 (pip install 'plunder[django]'); "
        f"tried {', '.join(names)}"
    )


tasks = _first("django.tasks", "django_tasks")
backends_base = _first("django.tasks.backends.base", "django_tasks.backends.base")
signals = _first("django.tasks.signals", "django_tasks.signals")
exceptions = _first("django.tasks.exceptions", "django_tasks.exceptions")
base = _first("django.tasks.base", "django_tasks.base")

BaseTaskBackend = backends_base.BaseTaskBackend
Task = base.Task
TaskContext = base.TaskContext
TaskError = base.TaskError
TaskResult = base.TaskResult
TaskResultStatus = base.TaskResultStatus
ResultDoesNotExist = exceptions.TaskResultDoesNotExist
InvalidTask = getattr(exceptions, "InvalidTask", None) or exceptions.InvalidTaskError
task_backends = tasks.task_backends
