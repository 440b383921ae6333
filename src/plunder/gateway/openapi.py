"""The gateway's API described for OpenAPI 3.1 (served at ``/openapi.json``)."""

from __future__ import annotations

from typing import Any

_STR: dict[str, Any] = {"type": "string"}
_INT: dict[str, Any] = {"type": "integer"}
_NUM: dict[str, Any] = {"type": "number"}
_BOOL: dict[str, Any] = {"type": "boolean"}
_STRS: dict[str, Any] = {"type": "array", "items": _STR}
_ANY: dict[str, Any] = {}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


_CLAIM = _object(["job_id", "attempt", "session_id"], job_id=_INT, attempt=_INT, session_id=_STR)
_TASK = _object(["name", "queue", "pool", "options"], name=_STR, queue=_STR, pool=_STR,
                options={"type": "object"})  # fmt: skip
_REQUEST = _object(["queues", "tasks", "limit"], queues=_STRS, tasks=_STRS,
                   limit={"type": "integer", "minimum": 0, "maximum": 10000},
                   take_suspect=_BOOL,
                   wait={"type": "number", "minimum": 0, "maximum": 60})  # fmt: skip
_ERROR = _object(["type", "message"], type=_STR, message=_STR, traceback=_STR)
_FAILURE = _object(["kind", "claim", "error"], kind={"const": "failure"}, claim=_CLAIM,
                   error=_ERROR, retry_delay={"type": ["number", "null"], "minimum": 0},
                   logs=_STRS, outcome=_STR)  # fmt: skip
_SPEC = _object(
    ["task"],
    task=_STR, args={"type": "array"}, kwargs={"type": "object"}, queue=_STR,
    priority=_INT, delay=_NUM, max_attempts=_INT, timeout={"type": ["number", "null"]},
    backoff_base=_NUM, backoff_cap=_NUM, retry_on_timeout=_BOOL,
    key={"type": ["string", "null"]}, retry_on_lost=_BOOL,
    expires_in={"type": ["number", "null"]},
    limit={"type": ["object", "null"]}, affinity={"type": ["object", "null"]},
    require={"type": ["object", "null"]}, cost=_INT,
)  # fmt: skip
_EDGE = _object(["parent", "child"], parent=_INT, child=_INT,
                on_failure={"enum": ["skip", "fail", "run"]}, new=_BOOL)  # fmt: skip
_HELLO = _object(["name", "host", "pid", "queues", "tasks", "expiry"], name=_STR, host=_STR,
                 pid=_INT, queues=_STRS, tasks={"type": "array", "items": _TASK},
                 expiry={"type": "number", "exclusiveMinimum": 0}, free_slots=_INT,
                 labels=_STRS, slots=_INT)  # fmt: skip

BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("/v1/sessions", "post"): _HELLO,
    ("/v1/sessions/{session_id}/heartbeat", "post"): _object(
        [],
        running={"type": "array", "items": _CLAIM},
        free_slots={"type": ["integer", "null"]},
        labels=_STRS,
    ),
    ("/v1/sessions/{session_id}/exchange", "post"): _object(
        [],
        done={
            "type": "array",
            "items": {
                "type": "array",
                "prefixItems": [_INT, _INT, _ANY, _STRS],
                "minItems": 4,
                "maxItems": 4,
            },
        },
        failed={"type": "array", "items": _FAILURE},
        released={
            "type": "array",
            "items": {"type": "array", "prefixItems": [_INT, _INT], "minItems": 2, "maxItems": 2},
        },
        claim={"oneOf": [_REQUEST, {"type": "null"}]},
    ),
    ("/v1/sessions/{session_id}/events", "post"): _object(
        ["claim", "events"],
        claim=_CLAIM,
        events={
            "type": "array",
            "items": _object(["kind"], kind={"enum": ["chunk", "progress"]}, data=_ANY),
        },
    ),
    ("/v1/sessions/{session_id}/watch", "post"): _object(
        ["queues", "wait"], queues=_STRS, wait={"type": "number", "minimum": 0, "maximum": 60}
    ),
    ("/v1/sessions/{session_id}/next-due", "post"): _REQUEST,
    ("/v1/sessions/{session_id}/close", "post"): _object(
        [], started={"type": "array", "items": _CLAIM}, lost=_BOOL
    ),
    ("/v1/sessions/{session_id}/queues", "post"): _object([], add=_STRS, remove=_STRS),
    ("/v1/sessions/{session_id}/pause-limit", "post"): _object(
        ["claim", "key", "seconds"], claim=_CLAIM, key=_STR, seconds={"type": "number"}
    ),
    ("/v1/sessions/{session_id}/parent-results", "post"): _object(["claim"], claim=_CLAIM),
    ("/v1/jobs", "post"): _object(
        ["jobs"],
        jobs={"type": "array", "items": _SPEC},
        records=_BOOL,
        edges={"type": "array", "items": _EDGE},
    ),
    ("/v1/keys", "post"): _object(
        ["role"],
        role={"enum": ["worker", "producer", "reader", "admin"]},
        group=_STR,
        queues=_STRS,
        expires={"type": ["number", "string", "null"]},  # seconds, or "30d", "12h", "15m"
        name={"type": "string", "maxLength": 200},
    ),
}

SUMMARIES = {
    "health": "The gateway and its database answer (for load balancers)",
    "open": "Open a worker session (a worker key)",
    "heartbeat": "Renew a session: running claims in, claims to stop out",
    "exchange": "Outcomes in, jobs out; a claim's wait long-polls for work",
    "append": "Append stream events and progress of a claim (fenced)",
    "watch": "Wait for work in some queues (claims nothing)",
    "next_due": "Seconds until the next delayed job of a claim request is due",
    "close": "Close a session; its unstarted jobs go back",
    "queues": "Join and leave queues (those the key may use); the session's queues now",
    "pause_limit": "Pause the claimed job's limit key and give the job back (fenced)",
    "parent_results": "The results of the claimed job's parents in its workflow (fenced)",
    "enqueue": "Enqueue jobs, and a workflow's edges between them (one transaction)",
    "list_jobs": "A page of jobs, newest first (any key but an admin's names a queue)",
    "get_job": "A job",
    "result": "A job once finished; ?wait= long-polls",
    "stream": "A job's stream as server-sent events (resumable: Last-Event-ID)",
    "events": "A job's stored stream events",
    "runs": "A job's attempts",
    "cancel": "Cancel a job",
    "retry": "Retry a finished job",
    "task": "A task as its workers published it",
    "workflow": "The workflow a job is in: its jobs and edges (those the key may see)",
    "workflow_edges": "The edges into and out of a job (to jobs the key may see)",
    "workflow_cancel": "Cancel the jobs of a job's workflow not started (those the key may see)",
    "keys_list": "The API keys, never a secret (an admin key)",
    "keys_create": "Make an API key; its secret is answered this once (an admin key)",
    "keys_revoke": "Revoke an API key and end the sessions it opened (an admin key)",
    "schedules_list": "The schedules of periodic jobs (an admin key)",
    "schedules_pause": "Pause a schedule: it enqueues nothing until resumed (an admin key)",
    "schedules_resume": "Resume a schedule from its first tick after now (an admin key)",
}
_LIST: list[dict[str, Any]] = [
    {"name": name, "in": "query", "required": False, "schema": schema}
    for name, schema in (
        ("queue", _STR), ("status", _STR), ("task", _STR),
        ("after", {"type": "integer", "minimum": 0}),
        ("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
    )
]  # fmt: skip
_WAIT = {"name": "wait", "in": "query", "required": False,
         "schema": {"type": "number", "minimum": 0, "maximum": 60}}  # fmt: skip
# any value: the heartbeat's answer names the session's queues (those the key may use)
_QUEUES = {"name": "queues", "in": "query", "required": False, "schema": _STR}
_QUERY = {"result": [_WAIT], "heartbeat": [_QUEUES], "list_jobs": _LIST}


def schema(routes: list[tuple[str, str, str]]) -> dict[str, Any]:
    """The OpenAPI document for ``routes`` (path, method, name)."""
    paths: dict[str, Any] = {}
    for path, method, name in routes:
        operation: dict[str, Any] = {
            "operationId": name,
            "summary": SUMMARIES.get(name, name),
            "responses": {
                "200": {"description": "done"},
                "201": {"description": "created"},
                "204": {"description": "done, nothing to say"},
                "400": {"description": "bad input: one line says what"},
                "401": {"description": "no valid API key"},
                "403": {"description": "the key may not do this"},
                "404": {"description": "not found (or not this key's)"},
                "413": {"description": "the body is too large"},
                "429": {"description": "too many failed authentications"},
                "503": {"description": "the database is busy or out of reach: retry"},
            },
            "security": [] if name == "health" else [{"key": []}],
        }
        parameters = [
            {
                "name": p,
                "in": "path",
                "required": True,
                "schema": _INT if p == "job_id" else _STR,
            }
            for p in _path_parameters(path)
        ]
        parameters += _QUERY.get(name, [])
        if parameters:
            operation["parameters"] = parameters
        request = BODIES.get((path, method.lower()))
        if request is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": request}},
            }
        paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "plunder gateway", "version": "1"},
        "paths": paths,
        "components": {"securitySchemes": {"key": {"type": "http", "scheme": "bearer"}}},
    }


def _path_parameters(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]
