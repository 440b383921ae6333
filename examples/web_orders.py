"""A web app that enqueues in its own transaction (standard library only: sqlite3 and
wsgiref). ``POST /orders`` inserts the order row and enqueues the job that charges it in one
sqlite3 transaction: both exist, or neither. The task marks the order paid in the
transaction that acknowledges the job, so a charge is recorded exactly once.

    python web_orders.py                         # serves http://127.0.0.1:8000
    plunder worker -A web_orders:app             # in this directory
    curl -d item=teapot http://127.0.0.1:8000/orders
    curl http://127.0.0.1:8000/orders/1
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import make_server

import plunder

DB = os.environ.get("SHOP_DB", "shop.db")
app = plunder.App(f"sqlite:///{DB}")  # the shop's tables and plunder's share one file

SCHEMA = """CREATE TABLE IF NOT EXISTS orders (
    id INTEGER PRIMARY KEY,
    item TEXT NOT NULL,
    paid INTEGER NOT NULL DEFAULT 0
)"""


@app.task(name="shop.charge", retries=5)
def charge(ctx: plunder.Context, order_id: int) -> None:
    with ctx.transaction() as conn:  # commits with this job's acknowledgement, or not at all
        conn.execute("UPDATE orders SET paid = 1 WHERE id = ?", (order_id,))


def place_order(item: str) -> tuple[int, int]:
    """The order row and its job, in one transaction: (order id, job id)."""
    conn = sqlite3.connect(DB)
    try:
        with conn:  # commits at the end of the block, or rolls back on an exception
            conn.execute(SCHEMA)
            cursor = conn.execute("INSERT INTO orders (item) VALUES (?)", (item,))
            assert cursor.lastrowid is not None
            job = charge.enqueue_in(conn, cursor.lastrowid)
        return cursor.lastrowid, job.id
    finally:
        conn.close()


def order_status(order_id: int) -> dict[str, Any] | None:
    conn = sqlite3.connect(DB)
    try:
        conn.execute(SCHEMA)
        row = conn.execute("SELECT item, paid FROM orders WHERE id = ?", (order_id,)).fetchone()
    finally:
        conn.close()
    return None if row is None else {"id": order_id, "item": row[0], "paid": bool(row[1])}


Respond = Callable[[str, list[tuple[str, str]]], Any]


def wsgi(environ: dict[str, Any], respond: Respond) -> Iterable[bytes]:
    """POST /orders (form field ``item``) and GET /orders/<id>."""
    method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
    if method == "POST" and path == "/orders":
        size = int(environ.get("CONTENT_LENGTH") or 0)
        form = parse_qs(environ["wsgi.input"].read(size).decode())
        item = form.get("item", [""])[0].strip()
        if not item:
            return reply(respond, "400 Bad Request", {"error": "item is required"})
        order_id, job_id = place_order(item)
        return reply(respond, "201 Created", {"order": order_id, "job": job_id})
    if method == "GET" and path.startswith("/orders/") and path[8:].isdigit():
        found = order_status(int(path[8:]))
        if found is not None:
            return reply(respond, "200 OK", found)
    return reply(respond, "404 Not Found", {"error": f"no route {method} {path}"})


def reply(respond: Respond, status: str, body: dict[str, Any]) -> list[bytes]:
    respond(status, [("Content-Type", "application/json")])
    return [json.dumps(body).encode()]


if __name__ == "__main__":
    # plunder's tables first (they put the file in WAL mode): an order's transaction must
    # not be the first to write a new file, since its enqueue then waits on a lock it holds
    app.store.migrate()
    with make_server("127.0.0.1", int(os.environ.get("PORT", "8000")), wsgi) as server:
        print(f"serving on http://127.0.0.1:{server.server_port}", flush=True)
        server.serve_forever()
