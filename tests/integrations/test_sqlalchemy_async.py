"""enqueue_in_async with async SQLAlchemy (psycopg's async driver on PostgreSQL, aiosqlite
on SQLite): an AsyncConnection's or AsyncSession's transaction decides whether the job
exists, as it decides the caller's own rows."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

import plunder
from plunder import errors, testing


@pytest.fixture
def app(store_url: str) -> Iterator[plunder.App]:
    app = plunder.App(store_url)
    yield app
    app.close()


def async_url(store_url: str) -> str:
    if store_url.startswith("sqlite:///"):
        return store_url.replace("sqlite:///", "sqlite+aiosqlite:///", 1)
    return store_url.replace("postgresql://", "postgresql+psycopg://", 1)


async def engine_for(store_url: str) -> AsyncEngine:
    engine = create_async_engine(async_url(store_url))
    async with engine.begin() as conn:
        await conn.execute(sa.text("CREATE TABLE notes (body TEXT)"))
    return engine


def register(app: plunder.App) -> Any:
    @app.task(name="note")
    def note(body: str) -> str:
        return body

    return note


async def notes(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return list((await conn.execute(sa.text("SELECT body FROM notes"))).scalars())


def test_an_async_connection_s_transaction_decides(app: plunder.App, store_url: str) -> None:
    note = register(app)

    async def main() -> Any:
        engine = await engine_for(store_url)
        try:
            async with engine.connect() as conn:
                await conn.execute(sa.text("INSERT INTO notes VALUES ('rolled back')"))
                await note.enqueue_in_async(conn, "rolled back")
                await conn.rollback()
                await conn.execute(sa.text("INSERT INTO notes VALUES ('kept')"))
                kept = await note.enqueue_in_async(conn, "kept")
                # not committed yet: plunder's own connections see no job
                assert testing.enqueued(app) == []
                await conn.commit()
            assert await notes(engine) == ["kept"]
            return kept
        finally:
            await engine.dispose()

    kept = asyncio.run(main())
    assert [j.args for j in testing.enqueued(app)] == [["kept"]]
    testing.run_until_idle(app)
    assert kept.result(timeout=0) == "kept"


def test_an_async_session_s_transaction_decides(app: plunder.App, store_url: str) -> None:
    note = register(app)

    async def main() -> None:
        engine = await engine_for(store_url)
        try:
            async with AsyncSession(engine) as session:
                await note.enqueue_in_async(session, "first thing in the session")
                session.add_all([])  # the session's transaction began with the enqueue
                await session.rollback()
                await session.execute(sa.text("INSERT INTO notes VALUES ('kept')"))
                await note.enqueue_in_async(session, "kept")
                await session.commit()
                with pytest.raises(ValueError, match="boom"):
                    async with session.begin():  # rolled back by the exception
                        await session.execute(sa.text("INSERT INTO notes VALUES ('lost')"))
                        await note.enqueue_in_async(session, "lost")
                        raise ValueError("boom")
            assert await notes(engine) == ["kept"]
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert [j.args for j in testing.enqueued(app)] == [["kept"]]


def test_the_sync_and_async_paths_refuse_each_other_s_connections(
    app: plunder.App, store_url: str
) -> None:
    note = register(app)

    async def main() -> None:
        engine = await engine_for(store_url)
        try:
            async with AsyncSession(engine) as session:
                with pytest.raises(errors.ConfigError, match=r"AsyncSession.*enqueue_in_async"):
                    note.enqueue_in(session, "x")
            sync_engine = sa.create_engine(async_url(store_url).replace("+aiosqlite", ""))
            try:
                with (
                    sync_engine.connect() as conn,
                    pytest.raises(errors.ConfigError, match="not Connection"),
                ):
                    await note.enqueue_in_async(conn, "x")
            finally:
                sync_engine.dispose()
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert testing.enqueued(app) == []


def test_starlette_s_enqueuer_joins_an_async_session(app: plunder.App, store_url: str) -> None:
    pytest.importorskip("starlette")
    from plunder.contrib.starlette import Enqueuer

    note = register(app)

    async def main() -> None:
        engine = await engine_for(store_url)
        try:
            async with AsyncSession(engine) as session:
                await Enqueuer(session).enqueue_async(note, "rolled back")
                await session.rollback()
                await Enqueuer(session).enqueue_async(note, "kept")
                await session.commit()
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert [j.args for j in testing.enqueued(app)] == [["kept"]]
