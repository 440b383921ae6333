"""A FastAPI app whose orders and their jobs commit together: the order is written with
SQLAlchemy, its receipt job is enqueued in the same session's transaction, and a page
streams a job's output as server-sent events.

    ORDERS_DB=sqlite:///orders.db uvicorn fastapi_orders:api       # the web app
    plunder worker -A fastapi_orders:jobs --db sqlite:///orders.db  # its worker

ORDERS_DB is plunder's URL (sqlite:///… or postgresql://…); SQLAlchemy uses the same
database through its sync driver (sqlite3, psycopg)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from sqlalchemy import Integer, String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import plunder
from plunder.contrib import fastapi as plunder_fastapi

URL = os.environ.get("ORDERS_DB", "sqlite:///orders.db")
jobs = plunder.App(URL)
engine = create_engine(URL.replace("postgresql://", "postgresql+psycopg://", 1))


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    item: Mapped[str] = mapped_column(String(100))
    quantity: Mapped[int] = mapped_column(Integer)


@jobs.task(name="fastapi_orders.send_receipt")
def send_receipt(ctx: plunder.Context, order_id: int, item: str, quantity: int) -> str:
    for n in range(1, quantity + 1):
        ctx.stream(f"{item} {n}/{quantity}")
    return f"receipt for order {order_id}"


def get_session() -> Iterator[Session]:
    with Session(engine) as session:
        yield session


class NewOrder(BaseModel):
    item: str
    quantity: int
    fail: bool = False


api = FastAPI(lifespan=plunder_fastapi.lifespan(jobs))
Base.metadata.create_all(engine)


@api.post("/orders", status_code=201)
def place_order(
    body: NewOrder,
    session: Session = Depends(get_session),  # noqa: B008
    enqueue: plunder_fastapi.Enqueuer = Depends(plunder_fastapi.enqueuer(get_session)),  # noqa: B008
) -> dict[str, int]:
    order = Order(item=body.item, quantity=body.quantity)
    session.add(order)
    session.flush()
    job = enqueue.enqueue(send_receipt, order.id, body.item, body.quantity)
    if body.fail:  # the order and its job roll back together
        session.rollback()
        raise HTTPException(402, "payment refused")
    session.commit()
    return {"order": order.id, "job": job.id}


@api.get("/jobs/{job_id}/events")
async def job_events(job_id: int) -> StreamingResponse:
    return plunder_fastapi.stream_response(jobs.job(job_id), timeout=30)
