"""The ``plunder`` group: its options, ``--db`` on either side of a command, and usage
mistakes and user errors as one line."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from plunder import config, logs
from plunder.cli.output import user_errors
from plunder.cli.state import State

NO_DB = {"bench"}  # the commands that take no --db


@contextmanager
def one_line_usage() -> Iterator[None]:
    """A usage mistake (``--limit -1``, ``job abc``) is one line too: click prints the usage
    text above the error only when the error carries its context."""
    try:
        yield
    except click.UsageError as exc:
        if type(exc).show is click.UsageError.show:  # not the help shown for no arguments
            exc.ctx = None
        raise


def _db_after(ctx: click.Context, _: click.Parameter, value: str | None) -> None:
    """``--db`` given after the command: it wins over the one before it (or PLUNDER_URL)."""
    state = ctx.find_object(State)
    if value is not None and state is not None:
        state.url, state.explicit = value, True


def _log_format_after(_: click.Context, __: click.Parameter, value: str | None) -> None:
    """``--log-format`` given after the command: logging set up anew with it."""
    if value is not None:
        logs.configure(logging.getLevelName(logging.getLogger().level), value)


class Group(click.Group):
    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with one_line_usage():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_usage(), user_errors():
            return super().invoke(ctx)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        """Every command that uses the database takes ``--db`` after its name too."""
        if (name or cmd.name) not in NO_DB:
            cmd.params.append(
                click.Option(
                    ["--db"],
                    default=None,
                    expose_value=False,
                    is_eager=True,  # set before the command's other options are read
                    callback=_db_after,
                    help="Database URL, as before the command (this one wins).",
                )
            )
        cmd.params.append(
            click.Option(
                ["--log-format"],
                default=None,
                expose_value=False,
                type=click.Choice(logs.FORMATS),
                callback=_log_format_after,
                help="As before the command (this one wins).",
            )
        )
        super().add_command(cmd, name)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    envvar="PLUNDER_URL",
    default=config.DEFAULT_URL,
    show_default=True,
    help="Database URL (sqlite:///file.db or postgresql://…), or a gateway's "
    "(https://host:8700, with --key); env PLUNDER_URL.",
)
@click.option(
    "--key",
    envvar="PLUNDER_KEY",
    default=None,
    help="API key for a gateway URL (http(s)://…); env PLUNDER_KEY.",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option(
    "--log-format",
    default="text",
    show_default=True,
    type=click.Choice(logs.FORMATS),
    help="Log lines as text, or as one JSON object a line (with a task's job fields).",
)
@click.version_option(package_name="plunder")
@click.pass_context
def main(ctx: click.Context, db: str, key: str | None, log_level: str, log_format: str) -> None:
    """plunder: a job queue where idle workers steal work from a database.

    --db goes before or after the command. Errors are one line on stderr: a usage mistake
    prints "Error: …" (click's) with exit status 2; anything else that fails (an unknown
    job, a database that is missing or refuses, a wait that timed out) prints "error: …"
    with exit status 1.
    """
    logs.configure(log_level, log_format)
    # httpx logs every request at INFO: a remote worker's log would be nothing else
    logging.getLogger("httpx").setLevel(
        max(logging.WARNING, logging.getLevelName(log_level.upper()))
    )
    source = ctx.get_parameter_source("db")
    explicit = source not in (click.core.ParameterSource.DEFAULT, None)
    ctx.obj = State(db, explicit, key)
    ctx.call_on_close(ctx.obj.close)
