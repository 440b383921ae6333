"""``plunder serve`` (the gateway) and ``plunder keys`` (its API keys, kept in the
database: made, listed and revoked with its URL, or through a gateway with an admin key)."""

from __future__ import annotations

import click
from rich import box
from rich.table import Table

from plunder import access, errors
from plunder.cli.output import emit_json, json_option, out, user_errors
from plunder.cli.state import State, pass_state


def parse_span(text: str) -> float:
    """``30d``, ``12h``, ``15m``, ``90s`` or plain seconds, as seconds."""
    try:
        return access.lifetime(text)
    except errors.ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8700, show_default=True)
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None)
@click.option(
    "--pool-size",
    type=click.IntRange(1, 100),
    default=8,
    show_default=True,
    help="Pooled database connections (plus one that listens).",
)
@pass_state
def serve(
    state: State, /, host: str, port: int, tls_cert: str | None, tls_key: str | None,
    pool_size: int,
) -> None:  # fmt: skip
    """Serve the gateway: workers and producers with an API key, no database URL."""
    with user_errors():
        try:
            from plunder.gateway import serve as run
        except ImportError as exc:
            raise errors.ConfigError(
                f"the gateway needs its extra: pip install 'plunder[gateway]' ({exc})"
            ) from exc
        state.direct("serve")
        if bool(tls_cert) != bool(tls_key):
            raise errors.ConfigError("--tls-cert and --tls-key go together")
        scheme = "https" if tls_cert else "http"
        click.echo(f"plunder gateway on {scheme}://{host}:{port} for {state.url}", err=True)
        click.echo(f"dashboard: {scheme}://{host}:{port}/ (log in with an API key)", err=True)
        run(state.url, host=host, port=port, tls_cert=tls_cert, tls_key=tls_key,
            pool_size=pool_size)  # fmt: skip


@click.group()
def keys() -> None:
    """API keys for the gateway (plunder serve): with the database's URL, or a gateway's
    and an admin key (--key)."""


@keys.command("create")
@click.option(
    "--role",
    required=True,
    type=click.Choice([r.value for r in access.Role]),
    help="What it may do.",
)
@click.option("--queues", default=None, help="Comma-separated queues it may use (default: all).")
@click.option("--group", default=access.DEFAULT_GROUP, show_default=True)
@click.option("--expires", default=None, help="Lifetime: 30d, 12h, 15m, 90s (default: none).")
@click.option("--name", default="", help="A note shown in `plunder keys list`.")
@json_option
@pass_state
def create(
    state: State, /, role: str, queues: str | None, group: str, expires: str | None, name: str,
    as_json: bool,
) -> None:  # fmt: skip
    """Make a key and print its secret, this once (only its hash is kept)."""
    with user_errors():
        lifetime = None if expires is None else parse_span(expires)
        key, secret = state.store(migrate=True).key_create(
            role=role, group=group, queues=access.parse_queues(queues), name=name,
            expires_in=lifetime,
        )  # fmt: skip
        if as_json:
            emit_json({**key.public(), "secret": secret})
            return
        click.echo(secret)
        click.echo(
            f"key {key.id}: {key.role.value} of group {key.group}; the secret above is "
            "shown once, keep it",
            err=True,
        )


@keys.command("list")
@json_option
@pass_state
def list_keys(state: State, /, as_json: bool) -> None:
    """Every key, revoked and expired ones included (never a secret)."""
    with user_errors():
        found = state.store().key_list()
        if as_json:
            emit_json([k.public() for k in found])
            return
        table = Table(box=box.SIMPLE_HEAD)
        table.add_column("id", no_wrap=True)  # whole: `plunder keys revoke ID` needs it
        for column in ("name", "role", "group", "queues", "created", "expires", "revoked"):
            table.add_column(column)
        for k in found:
            table.add_row(
                k.id, k.name, k.role.value, k.group, ",".join(k.queues) or "*",
                f"{k.created_at:%Y-%m-%d %H:%M}",
                f"{k.expires_at:%Y-%m-%d %H:%M}" if k.expires_at else "-",
                f"{k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else "-",
            )  # fmt: skip
        out.print(table)


@keys.command("revoke")
@click.argument("key_id")
@json_option
@pass_state
def revoke(state: State, /, key_id: str, as_json: bool) -> None:
    """Revoke a key: it stops working within a second, and the worker sessions it opened
    end now (their running jobs are rescued as lost)."""
    with user_errors():
        key, sessions = state.store().key_revoke(key_id)
        if as_json:
            emit_json({**key.public(), "sessions_ended": sessions})
            return
        click.echo(f"key {key.id} revoked; {len(sessions)} session(s) ended")
