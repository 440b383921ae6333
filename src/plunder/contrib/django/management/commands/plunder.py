"""``manage.py plunder …``: plunder's command line on the task backend's database."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from plunder.contrib.django import compat
from plunder.contrib.django.backend import PlunderBackend


class Command(BaseCommand):
    help = "plunder's command line (manage.py plunder --help) on the task backend's database."

    def run_from_argv(self, argv: list[str]) -> None:
        """Every argument is plunder's (click parses them), with ``--db`` set to the
        default task backend's database unless given."""
        from plunder.cli import main

        rest = argv[2:]
        if not any(a == "--db" or a.startswith("--db=") for a in rest):
            backend = compat.task_backends["default"]
            if isinstance(backend, PlunderBackend):
                rest = ["--db", backend.url, *rest]
        main.main(args=rest, prog_name=f"{argv[0]} plunder")

    def handle(self, *args: Any, **options: Any) -> None:  # run_from_argv does the work
        raise NotImplementedError("call it as manage.py plunder …")
