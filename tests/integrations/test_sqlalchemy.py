"""enqueue_in with SQLAlchemy: a sync Connection or Session joins its transaction, on
SQLite and PostgreSQL; an async one, or an Engine, is refused with a clear error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

import sqlalchemy as sa
from sqlalchemy.orm import Session

import plunder
from plunder import errors, testing


@pytest.fixture
def app(store_url: str) -> Iterator[plunder.App]:
    app = plunder.App(store_url)
    yield app
    app.close()


@pytest.fixture
def engine(store_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(store_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE notes (body TEXT)"))
    yield engine
    engine.dispose()


def register(app: plunder.App) -> Any:
    @app.task(name="note")
    def note(body: str) -> str:
        return body

    return note


def test_a_connection_s_transaction_decides(app: plunder.App, engine: sa.Engine) -> None:
    note = register(app)
    with engine.connect() as conn:
        conn.execute(sa.text("INSERT INTO notes VALUES ('rolled back')"))
        note.enqueue_in(conn, "rolled back")
        conn.rollback()
        conn.execute(sa.text("INSERT INTO notes VALUES ('kept')"))
        kept = note.enqueue_in(conn, "kept")
        conn.commit()
    assert [j.args for j in testing.enqueued(app)] == [["kept"]]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT body FROM notes")).scalars().all() == ["kept"]
    testing.run_until_idle(app)
    assert kept.result(timeout=0) == "kept"


def test_a_session_s_transaction_decides(app: plunder.App, engine: sa.Engine) -> None:
    note = register(app)
    with Session(engine) as session:
        note.enqueue_in(session, "first thing in the session")  # begins its transaction
        session.rollback()
        session.execute(sa.text("INSERT INTO notes VALUES ('kept')"))
        note.enqueue_in(session, "kept")
        session.commit()
    assert [j.args for j in testing.enqueued(app)] == [["kept"]]


def test_async_and_engines_are_refused(app: plunder.App, engine: sa.Engine) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    note = register(app)
    async_engine = create_async_engine("postgresql+psycopg://nobody@localhost/none")
    with pytest.raises(errors.ConfigError, match=r"AsyncSession.*synchronous"):
        note.enqueue_in(AsyncSession(async_engine), "x")
    with pytest.raises(errors.ConfigError, match="not an Engine"):
        note.enqueue_in(engine, "x")
