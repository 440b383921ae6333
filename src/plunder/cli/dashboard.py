"""``plunder dashboard``: the dashboard alone, on this machine, for its user (no key: the
database's URL is the credential). ``plunder serve`` serves the same pages to key holders."""

from __future__ import annotations

import click

from plunder import errors
from plunder.cli.output import user_errors
from plunder.cli.state import State, pass_state


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (anyone who reaches it acts as admin).")  # fmt: skip
@click.option("--port", type=click.IntRange(1, 65535), default=8710, show_default=True)
@pass_state
def dashboard(state: State, /, host: str, port: int) -> None:
    """Serve the dashboard on the database, without a gateway: for a local look."""
    with user_errors():
        state.direct("dashboard")
        try:
            from plunder.dashboard import serve
        except ImportError as exc:
            raise errors.ConfigError(
                f"the dashboard needs the gateway's extra: pip install 'plunder[gateway]' ({exc})"
            ) from exc
        state.store().schema_check()  # a wrong URL is one line here, not a traceback there
        click.echo(f"plunder dashboard on http://{host}:{port}/ for {state.url}", err=True)
        serve(state.url, host=host, port=port)
