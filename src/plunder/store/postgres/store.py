"""The PostgreSQL store: the shared SQL store (plunder.store.sqlbase) over a PostgreSQL
driver (plunder.store.postgres.driver), with its own turns (exchange)."""

from __future__ import annotations

from typing import Any

from plunder.store.acks import Acks
from plunder.store.engine import Engine
from plunder.store.postgres.driver import PgDriver
from plunder.store.postgres.exchange import PgTurns
from plunder.store.sqlbase import SQLStore


class PostgresStore(SQLStore):
    """The Store protocol on a PostgreSQL database (see PgDriver for how it is used)."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 4,
        connect_timeout: float = 10.0,
        application_name: str = "plunder",
        statement_timeout: float | None = None,
        tcp_user_timeout: float = 10.0,
        call_timeout: float | None = None,
        idle_timeout: float | None = None,
        **options: Any,
    ) -> None:
        driver = PgDriver(
            url,
            pool_size=pool_size,
            connect_timeout=connect_timeout,
            application_name=application_name,
            statement_timeout=statement_timeout,
            tcp_user_timeout=tcp_user_timeout,
            call_timeout=call_timeout,
            idle_timeout=idle_timeout,
        )

        def turns(engine: Engine, acks: Acks) -> PgTurns:
            return PgTurns(driver, engine, acks)

        super().__init__(driver, turns=turns, **options)
