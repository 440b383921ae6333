"""``manage.py plunder_worker``: a plunder worker for the project's Django tasks."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import autodiscover_modules

from plunder import config, errors
from plunder.contrib.django import compat
from plunder.contrib.django.backend import PlunderBackend
from plunder.execution import tune_gc
from plunder.options import WorkerOptions
from plunder.worker import Worker


class Command(BaseCommand):
    help = (
        "Run a plunder worker for the Django tasks of a plunder task backend (the tasks "
        "modules of the installed apps, and --module)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--backend", default="default", help="The TASKS alias.")
        parser.add_argument("-q", "--queues", default=None, help="Comma-separated queues.")
        parser.add_argument("-c", "--concurrency", type=int, default=4)
        parser.add_argument("--name", default=None, help="The worker's name.")
        parser.add_argument("--grace", type=float, default=config.GRACE)
        parser.add_argument("--no-janitor", action="store_true")
        parser.add_argument(
            "--module",
            action="append",
            default=[],
            help="Also import this module for its tasks (repeatable).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        backend = compat.task_backends[options["backend"]]
        if not isinstance(backend, PlunderBackend):
            raise CommandError(f"task backend {options['backend']!r} is not a PlunderBackend")
        if not logging.getLogger().handlers:  # as plunder worker logs, unless LOGGING says
            logging.basicConfig(
                level=logging.INFO,
                stream=sys.stderr,
                format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            )
        autodiscover_modules("tasks")  # defining a task registers it with the backend's App
        for module in options["module"]:
            importlib.import_module(module)
        queues = options["queues"]
        worker_options = WorkerOptions(
            queues=tuple(q.strip() for q in queues.split(",") if q.strip()) if queues else None,
            concurrency=options["concurrency"],
            name=options["name"],
            janitor=not options["no_janitor"],
            grace=options["grace"],
        )
        try:
            tune_gc()
            Worker(backend.app, worker_options).run()
        except errors.PlunderError as exc:
            raise CommandError(str(exc)) from exc
