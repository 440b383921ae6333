"""The producer's store through a gateway: ``plunder.App("https://host:8700", key=...)``.

It offers what a producer and a reader use — enqueue (workflows too), list, read, cancel,
retry, runs, streams, published tasks, workflows read and cancelled — and an admin's keys
(make, list, revoke), with waits done at the gateway (a result's long-poll, a stream's
server-sent events). What needs the database itself (a worker's own operations, the
janitor's, ``enqueue(conn=...)``) raises ConfigError naming what to use instead.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator, Iterator, Sequence
from datetime import datetime
from typing import Any, NoReturn

import httpx

from plunder import access, errors, policy, wire, wire_specs
from plunder.access import ApiKey
from plunder.model import JobPage, JobRecord, JobSpec, Run, StreamEvent, TaskInfo
from plunder.states import is_terminal
from plunder.store.http.client import Client, error_of
from plunder.store.http.flows import MAX_BATCH, HttpFlows
from plunder.store.http.flows import path_id as _id

RESULT_WAIT = 25.0  # seconds one long-poll for a result may last (a proxy may cut longer)


class HttpStore(HttpFlows):
    """The producer's part of the Store protocol over a gateway (see the module), and
    workflows (plunder.store.http.flows)."""

    dialect = "http"
    notifies = False

    def __init__(self, url: str, *, key: str | None = None, **options: Any) -> None:
        key = key or os.environ.get("PLUNDER_KEY")
        verify = options.pop("verify", True)
        busy_total = float(options.pop("busy_total", policy.BUSY_TOTAL))
        unknown = set(options) - _IGNORED
        if unknown:
            raise errors.ConfigError(
                f"option(s) {', '.join(sorted(unknown))} do not apply to a gateway URL"
            )
        self.client = Client(url, key, verify=verify, busy_total=busy_total)
        self.url = self.client.url

    def __repr__(self) -> str:
        return f"HttpStore({self.url!r})"

    # -- what every store does -------------------------------------------------------------
    def migrate(self) -> int:
        return 0  # the gateway's database is the gateway's to migrate

    def schema_check(self) -> int:
        return 0

    def close(self) -> None:
        self.client.close()

    def now(self) -> datetime:
        data = self.client.call("GET", "/v1/health")
        return wire.time_in(data["database_time"])

    # -- producers -------------------------------------------------------------------------
    def job_enqueue_many(
        self, specs: Sequence[JobSpec], *, conn: Any = None, now: Any = None
    ) -> list[JobRecord]:
        data = self._enqueue(specs, conn, now, records=True)
        return [wire.job_in(j) for j in data["jobs"]]

    def job_enqueue_ids(
        self, specs: Sequence[JobSpec], *, conn: Any = None, now: Any = None
    ) -> list[int]:
        return [int(i) for i in self._enqueue(specs, conn, now, records=False)["ids"]]

    def _enqueue(self, specs: Sequence[JobSpec], conn: Any, now: Any, *, records: bool) -> Any:
        if conn is not None:
            raise NeedsDatabase(_needs_database("enqueue in a transaction of your own (conn=...)"))
        if now is not None:
            raise errors.ConfigError("through a gateway the database's clock decides 'now'")
        if len(specs) > MAX_BATCH:
            raise errors.PayloadError(f"at most {MAX_BATCH} jobs per enqueue, got {len(specs)}")
        body = {"jobs": [wire_specs.spec_out(s) for s in specs], "records": records}
        # an enqueue whose every job has a key is safe to send twice: the keys dedupe it
        keyed = all(s.key is not None for s in specs)
        return self.client.call("POST", "/v1/jobs", json=body, idempotent=keyed)

    def job_get(self, job_id: int) -> JobRecord:
        return wire.job_in(self.client.call("GET", f"/v1/jobs/{_id(job_id)}"))

    def job_cancel(self, job_id: int, *, now: Any = None) -> JobRecord:
        return wire.job_in(self.client.call("POST", f"/v1/jobs/{_id(job_id)}/cancel"))

    def job_retry(self, job_id: int, *, now: Any = None) -> JobRecord:
        return wire.job_in(self.client.call("POST", f"/v1/jobs/{_id(job_id)}/retry"))

    def job_list(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        task: str | None = None,
        after: int | None = None,
        limit: int = 50,
    ) -> JobPage:
        """A page of jobs, newest first: every queue's for an admin key; any other key
        names a queue of its own."""
        given = {"queue": queue, "status": status, "task": task, "after": after}
        params = {name: value for name, value in given.items() if value is not None}
        data = self.client.call("GET", "/v1/jobs", params={**params, "limit": limit})
        after_id = data["next_after"]
        return JobPage(tuple(wire.job_in(j) for j in data["jobs"]),
                       None if after_id is None else int(after_id))  # fmt: skip

    def job_runs(self, job_id: int) -> list[Run]:
        data = self.client.call("GET", f"/v1/jobs/{_id(job_id)}/runs")
        return [wire.run_in(r) for r in data["runs"]]

    def stream_read(self, job_id: int, *, after: int = 0, limit: int = 1000) -> list[StreamEvent]:
        data = self.client.call(
            "GET", f"/v1/jobs/{_id(job_id)}/events", params={"after": after, "limit": limit}
        )
        return [wire.event_in(e) for e in data["events"]]

    def task_get(self, name: str) -> TaskInfo | None:
        try:
            return wire.task_info_in(self.client.call("GET", f"/v1/tasks/{name}"))
        except errors.JobNotFound:  # the gateway's 404: no worker published it
            return None

    # -- keys (an admin key's) ----------------------------------------------------------------
    def key_create(
        self,
        *,
        role: str,
        group: str = access.DEFAULT_GROUP,
        queues: Sequence[str] = (),
        name: str = "",
        expires_in: float | None = None,
        now: Any = None,
    ) -> tuple[ApiKey, str]:
        if now is not None:
            raise errors.ConfigError("through a gateway the database's clock decides 'now'")
        body = {"role": role, "group": group, "queues": list(queues), "name": name,
                "expires": expires_in}  # fmt: skip
        # not sent twice: a lost answer would leave a key whose secret no one has
        data = self.client.call("POST", "/v1/keys", json=body, idempotent=False)
        return _key_in(data["key"]), str(data["secret"])

    def key_list(self) -> list[ApiKey]:
        return [_key_in(k) for k in self.client.call("GET", "/v1/keys")["keys"]]

    def key_revoke(self, key_id: str, *, now: Any = None) -> tuple[ApiKey, list[str]]:
        if now is not None:
            raise errors.ConfigError("through a gateway the database's clock decides 'now'")
        access.check_key_id(key_id)
        data = self.client.call("POST", f"/v1/keys/{key_id}/revoke")
        return _key_in(data["key"]), [str(s) for s in data["sessions_ended"]]

    # -- waits at the gateway ----------------------------------------------------------------
    def job_wait(self, job_id: int, timeout: float | None) -> JobRecord:
        """The job once terminal (long-polls); TimeoutError if ``timeout`` passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = RESULT_WAIT if deadline is None else deadline - time.monotonic()
            wait = max(0.0, min(RESULT_WAIT, left))
            data = self.client.call(
                "GET", f"/v1/jobs/{_id(job_id)}/result", params={"wait": wait}, wait=wait
            )
            record = wire.job_in(data)
            if is_terminal(record.status):
                return record
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} is still {record.status} after {timeout}s")

    def job_stream(
        self, job_id: int, *, timeout: float | None = None
    ) -> Generator[StreamEvent, None, None]:
        """The job's stream events as the gateway sends them (server-sent events), resumed
        after the last one seen when the connection drops, until the job is terminal."""
        started = time.monotonic()
        last = 0
        while True:
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(last)}
            try:
                with self.client.stream(
                    f"/v1/jobs/{_id(job_id)}/stream", headers=headers
                ) as answer:
                    if answer.status_code != 200:
                        answer.read()
                        raise _refusal(answer, self.url)
                    for kind, seq, data in _sse(answer.iter_lines()):
                        if kind == "end":
                            return
                        event = wire.event_in(data)
                        if seq is not None:
                            last = seq
                        yield event
                        if timeout is not None and time.monotonic() - started > timeout:
                            raise TimeoutError(f"job {job_id} still running after {timeout}s")
            except httpx.TransportError as exc:  # dropped: resume after the last event,
                if timeout is not None and time.monotonic() - started > timeout:  # elsewhere
                    raise TimeoutError(f"job {job_id} still running after {timeout}s") from exc
                self.client.rotate()
                time.sleep(policy.BUSY_INTERVAL)

    # -- what needs the database -------------------------------------------------------------
    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("_"):
            raise AttributeError(name)
        raise NeedsDatabase(_needs_database(name))


class NeedsDatabase(errors.ConfigError, AttributeError):
    """A store operation that a gateway does not offer (an AttributeError too, so that
    ``hasattr`` and ``getattr(store, name, default)`` see it as absent)."""


_IGNORED = frozenset(
    {"pool_size", "application_name", "call_timeout", "idle_timeout", "statement_timeout",
     "connect_timeout", "tcp_user_timeout", "busy_timeout"}
)  # fmt: skip


def _needs_database(what: str) -> str:
    return (
        f"{what} needs the database itself, not a gateway: use a postgresql:// or "
        "sqlite:/// URL for it"
    )


def _key_in(data: Any) -> ApiKey:
    """A key as the gateway answers it (ApiKey.public: never its hash)."""
    fields = wire.Fields(data, "a key")
    key = ApiKey(
        id=access.check_key_id(fields.take("id", str)),
        name=fields.take("name", str),
        role=access.check_role(fields.take("role", str)),
        group=fields.take("group", str),
        queues=fields.strings("queues"),
        created_at=wire.time_in(fields.take("created_at", str), "a key's 'created_at'"),
        expires_at=fields.time("expires_at"),
        revoked_at=fields.time("revoked_at"),
    )
    fields.done()
    return key


def _refusal(answer: Any, url: str) -> Exception:
    try:
        data = json.loads(answer.text)
    except ValueError:
        data = None
    return error_of(answer.status_code, data, url)


def _sse(lines: Iterator[str]) -> Iterator[tuple[str, int | None, Any]]:
    """Server-sent events as (event name, id or None, data decoded)."""
    kind: str = "message"
    seq: int | None = None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield kind, seq, json.loads("\n".join(data))
            kind, seq, data = "message", None, []  # the next event
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                kind = value
            elif name == "id" and value.isdigit():
                seq = int(value)
            elif name == "data":
                data.append(value)
