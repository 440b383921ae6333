"""The long-running commands: ``worker`` (with the user's App) and ``janitor``."""

from __future__ import annotations

import faulthandler
import importlib
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

import click

from plunder import config, errors, metrics
from plunder.app import App
from plunder.cli.output import F, user_errors
from plunder.cli.state import CLI_STORE, State, pass_state
from plunder.config import WorkerDeadlines
from plunder.execution import tune_gc
from plunder.options import WorkerOptions
from plunder.store import open_store
from plunder.turns import MAX_DEPTH
from plunder.worker import Worker

if TYPE_CHECKING:
    from plunder.store.http import HttpLink


def load_app(spec: str, state: State) -> App:
    """The App named by ``-A module:attribute``, on the command's URL if one was given."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter("use -A module:attribute, e.g. -A myproject.jobs:app")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise errors.ConfigError(f"cannot import {module_name}: {exc}") from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise errors.ConfigError(f"{spec} is not a plunder.App (got {type(app).__name__})")
    if state.explicit:
        app.configure(url=state.url)
    return app


def interval_options(fn: F) -> F:
    for name in ("heartbeat-interval", "session-expiry", "poll-interval", "janitor-interval"):
        env = "PLUNDER_" + name.upper().replace("-", "_")
        fn = click.option(f"--{name}", type=float, default=None, help=f"Seconds (env {env}).")(fn)
    return fn


@click.command()
@click.option("-A", "--app", "app_spec", required=True, help="module:attribute of your App.")
@click.option(
    "-q",
    "--queues",
    default=None,
    help="Comma-separated queues (default: all queues of the app's tasks).",
)
@click.option("-c", "--concurrency", type=click.IntRange(1, 10_000), default=4, show_default=True)
@click.option(
    "--pool",
    type=click.Choice(["thread", "process"]),
    default=None,
    help="Run plain-function tasks in threads (default) or a warm pool of child processes.",
)
@click.option(
    "--grace",
    type=float,
    default=config.GRACE,
    show_default=True,
    help="Seconds running jobs get to finish after SIGTERM.",
)
@click.option("--name", default=None, help="Worker name shown in status and run history.")
@click.option(
    "--label",
    "labels",
    multiple=True,
    help="A label key=value this worker holds (repeatable): jobs with affinity for it "
    "prefer it, jobs requiring it wait for it (docs/guide/affinity.md).",
)
@click.option("--no-janitor", is_flag=True, help="Do not take part in janitor duty.")
@click.option(
    "--no-listen",
    is_flag=True,
    help="No LISTEN/NOTIFY or data_version wake-ups: "
    "poll every --poll-interval (env PLUNDER_LISTEN=0).",
)
@click.option(
    "--depth",
    type=click.IntRange(1, MAX_DEPTH),
    default=MAX_DEPTH,
    show_default=True,
    help="Turns (results out, a claim in) in flight at most. Above 1, on PostgreSQL, a busy "
    "worker sends its next turns while it starts the jobs of the last, on a connection it "
    "holds, idle or busy (3 connections per worker instead of 2); each turn claims up to a "
    "1/depth share of the slots (-c 300: batches of 100). SQLite makes one at a time.",
)
@click.option(
    "--url",
    default=None,
    help="A gateway's URL (https://host:8700; several, comma-separated, fail over): the "
    "worker needs an API key (--key) and no database URL.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus metrics at http://0.0.0.0:PORT/metrics (needs plunder[metrics]).",
)
@interval_options
@pass_state
def worker(
    state: State,
    /,
    app_spec: str,
    url: str | None,
    queues: str | None,
    concurrency: int,
    pool: str | None,
    grace: float,
    name: str | None,
    labels: tuple[str, ...],
    no_janitor: bool,
    no_listen: bool,
    depth: int,
    metrics_port: int | None,
    **intervals: float | None,
) -> None:
    """Run a worker: claim jobs, run them, acknowledge them."""
    with user_errors():
        if url is not None:
            state.url, state.explicit = url, True
        app = load_app(app_spec, state)
        app.configure(**intervals, listen=False if no_listen else None)
        queue_list = tuple(q.strip() for q in queues.split(",") if q.strip()) if queues else None
        options = WorkerOptions(
            queues=queue_list,
            concurrency=concurrency,
            name=name,
            janitor=not no_janitor,
            grace=grace,
            pool=pool,
            depth=depth,
            labels=labels,
        )
        tune_gc()
        _stacks_on_usr1()
        running = Worker(app, options, link=_gateway_link(state, app))
        if metrics_port is not None:
            metrics.serve(metrics_port, running.store)
        running.run()  # halted, the process ends in there (plunder.halting)


def _stacks_on_usr1() -> None:
    """SIGUSR1 prints every thread's stack to stderr: a worker that hangs says where."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (captured): nowhere to print
        return
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def _gateway_link(state: State, app: App) -> HttpLink | None:
    """The link to a gateway, where the worker's URL is one (``--url`` or the app's);
    None: the worker speaks to the database."""
    url = app.url
    if not url.lower().startswith(("http://", "https://")):
        return None
    from plunder.store.http import Client, HttpLink  # httpx: only for a gateway's worker

    deadlines = WorkerDeadlines.of(app.settings)  # as on the database: no call outlives them
    key = state.key or os.environ.get("PLUNDER_KEY")
    client = Client(
        url, key, call_timeout=deadlines.call_timeout, busy_total=deadlines.call_timeout
    )
    return HttpLink(client, heartbeat_timeout=deadlines.heartbeat_timeout)


@click.command()
@interval_options
@pass_state
def janitor(state: State, /, **intervals: float | None) -> None:
    """Run only the janitor (reaping, timeouts, pruning) while holding its lease."""
    from plunder.janitor import Janitor

    with user_errors():
        state.direct("janitor")
        settings = config.load(url=state.url).with_overrides(**intervals)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        # its own deadlines, so that a pass it leaves open (paused, cut off) cannot hold
        # up a successor's takeover for good
        deadlines = config.WorkerDeadlines.of(settings).janitor_store_options()
        store = open_store(state.url, **{**CLI_STORE, **deadlines})
        store.schema_check()
        try:
            Janitor(store, settings).run(stop)
        finally:
            store.close()
