"""plunder shown at work and measured: ``demo`` (workers, a crash, a rescue) and ``bench``
(beside its peers, from a source checkout)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from plunder.cli.output import emit_json, err, json_option, out, user_errors
from plunder.cli.state import State, pass_state

CHECKOUT = Path(__file__).resolve().parents[3]  # src/plunder/cli/ in a source checkout


@click.command()
@click.option("--workers", type=click.IntRange(2, 16), default=3, show_default=True)
@click.option("--jobs", "job_count", type=click.IntRange(20, 5000), default=300, show_default=True)
@click.option(
    "--gateway",
    is_flag=True,
    help="Through a gateway: remote workers with keys of two groups, no database URL.",
)
@json_option
@pass_state
def demo(state: State, workers: int, job_count: int, gateway: bool, as_json: bool) -> None:
    """Watch work stealing: workers, a crash, a rescue. Uses a temporary SQLite file unless
    --db is given."""
    from plunder import demo as demo_module

    with user_errors():
        state.direct("demo")
        if gateway:
            from plunder import demo_gateway

            url = state.url if state.explicit else None
            result = demo_gateway.run(url, console=out, quiet=as_json)
            if as_json:
                emit_json(result)
            return
        summary = demo_module.run(
            state.url if state.explicit else None,
            workers=workers,
            jobs=job_count,
            console=out,
            quiet=as_json,
        )
        if as_json:
            emit_json(summary)


@click.command()
@click.option("--quick", is_flag=True, help="Tiny sizes: checks that it works, measures nothing.")
@click.option("--repeat", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option("--systems", default=None, help="Comma-separated systems (default: all).")
@click.option(
    "--scenarios",
    default=None,
    help="Comma-separated scenario numbers 1-10 (9, the fleet, runs only when named).",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None)
def bench(
    quick: bool, repeat: int, systems: str | None, scenarios: str | None, json_path: str | None
) -> None:
    """Benchmark plunder beside its peers on a throwaway PostgreSQL cluster (a source
    checkout's bench/ package; the peers install into bench/.venv on first use)."""
    sys.path.insert(0, os.getcwd())
    sys.path.insert(1, str(CHECKOUT))
    try:
        from bench import harness
    except ImportError as exc:
        err.print(f"[red]error:[/red] plunder bench runs from a source checkout: {exc}")
        sys.exit(1)
    options = harness.Options(quick=quick, repeat=repeat, echo=click.echo)
    if quick:
        options.sizes = harness.Sizes.quick()
    if systems:
        options.systems = [s.strip() for s in systems.split(",") if s.strip()]
    if scenarios:
        options.scenarios = [s.strip() for s in scenarios.split(",") if s.strip()]
    options.json_path = Path(json_path) if json_path else None
    sys.exit(harness.main(options))
