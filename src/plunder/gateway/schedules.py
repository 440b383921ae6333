"""The schedules over HTTP, for admin keys only (docs/guide/periodic.md): list them, pause
one, resume one. Adding and removing stay with ``plunder schedules`` and the code.

```
 GET  /v1/schedules                  {"schedules": [{…}, …]}, by name
 POST /v1/schedules/{name}/pause     {"schedule": {…}}: enqueues nothing until resumed
 POST /v1/schedules/{name}/resume    {"schedule": {…}}: from its first tick after now
```
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from plunder import cron, errors
from plunder.cron import Schedule
from plunder.gateway.auth import Refused
from plunder.gateway.server import Gateway, key_of

MANAGE = "manage schedules (only an admin key may)"


def public(schedule: Schedule) -> dict[str, Any]:
    """A schedule as JSON: times as ISO 8601 text (UTC)."""

    def iso(value: Any) -> Any:
        return None if value is None else value.isoformat()

    return {
        "name": schedule.name,
        "task": schedule.task,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "queue": schedule.queue,
        "args": schedule.args,
        "kwargs": schedule.kwargs,
        "catch_up": schedule.catch_up,
        "paused": schedule.paused,
        "next_at": iso(schedule.next_at),
        "last_at": iso(schedule.last_at),
        "last_job_id": schedule.last_job_id,
        "created_at": iso(schedule.created_at),
        "updated_at": iso(schedule.updated_at),
    }


def _name(request: Request) -> str:
    raw = str(request.path_params["name"])
    try:
        return cron.check_name(raw)
    except errors.InvalidSchedule:
        raise Refused(404, f"no schedule {raw[:40]!r}") from None


async def schedules_list(gateway: Gateway, request: Request) -> Response:
    await key_of(gateway, request, "admin", MANAGE)
    found = await run_in_threadpool(gateway.store.schedule_list)
    return JSONResponse({"schedules": [public(s) for s in found]})


async def _pause(gateway: Gateway, request: Request, paused: bool) -> Response:
    await key_of(gateway, request, "admin", MANAGE)
    name = _name(request)
    try:
        schedule = await run_in_threadpool(gateway.store.schedule_pause, name, paused)
    except errors.ScheduleNotFound:
        raise Refused(404, f"no schedule {name!r}") from None
    return JSONResponse({"schedule": public(schedule)})


async def schedules_pause(gateway: Gateway, request: Request) -> Response:
    return await _pause(gateway, request, True)


async def schedules_resume(gateway: Gateway, request: Request) -> Response:
    return await _pause(gateway, request, False)


ROUTES = [
    ("/v1/schedules", "GET", schedules_list),
    ("/v1/schedules/{name}/pause", "POST", schedules_pause),
    ("/v1/schedules/{name}/resume", "POST", schedules_resume),
]
