"""The dashboard's pages and actions: each a Starlette endpoint that finds its visitor,
reads through ``Views`` on a worker thread, and renders a template.

An action is two steps: a GET of ``/confirm`` shows what it will do and a form; the POST
of that form to ``/act`` (admin visitors only, its CSRF token checked) does it and sends
the browser back. Any other visitor's POST is refused with 403.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from plunder import access, errors, payload
from plunder.dashboard import svg
from plunder.dashboard.views import SHOWN, STATUSES, Views, age, short
from plunder.dashboard.visitors import COOKIE, COOKIE_LIFETIME, Visitor, Visitors, csrf_ok
from plunder.states import Status
from plunder.store.observing import JobFilter

MAX_FORM = 64 * 1024  # bytes in a posted form
BULK_MAX = 10_000  # jobs one bulk action touches at most
FILTERS = ("queue", "task", "status", "group", "key", "since", "until")


def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("plunder.dashboard", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    env.globals.update(
        age=age, short=short, spark=svg.sparkline, statuses=STATUSES, shown=SHOWN, pretty=_pretty
    )
    return env


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


class Pages:
    """The dashboard's endpoints over ``views`` and ``visitors``."""

    def __init__(self, views: Views, visitors: Visitors, *, secure: bool = False) -> None:
        self.views = views
        self.visitors = visitors
        self.env = environment()
        self.secure = secure  # cookies only over HTTPS

    # -- plumbing ------------------------------------------------------------------------
    async def visitor(self, request: Request) -> Visitor | None:
        return await run_in_threadpool(self.visitors.visitor, request.cookies.get(COOKIE))

    def render(self, name: str, request: Request, status: int = 200, **context: Any) -> Response:
        notice = request.cookies.get("plunder_notice")  # what the last action did
        html = self.env.get_template(name).render(root=_root(request), notice=notice, **context)
        answer = HTMLResponse(html, status_code=status, headers=_NO_CACHE)
        if notice:
            answer.delete_cookie("plunder_notice", path=_root(request))
        return answer

    def fragment(self, name: str, request: Request, **context: Any) -> str:
        return self.env.get_template(name).render(root=_root(request), **context)

    def to_login(self, request: Request) -> Response:
        return RedirectResponse(f"{_root(request)}login", status_code=303)

    # -- login -----------------------------------------------------------------------------
    async def login_form(self, request: Request) -> Response:
        if self.visitors.local:
            return RedirectResponse(_root(request), status_code=303)
        return self.render("login.html", request, visitor=None)

    async def login(self, request: Request) -> Response:
        form = await _form(request)
        secret = str(form.get("secret") or "")
        cookie, error = await run_in_threadpool(self.visitors.login, secret)
        if error:
            return self.render("login.html", request, 401, visitor=None, error=error)
        answer = RedirectResponse(_root(request), status_code=303)
        answer.set_cookie(
            COOKIE, cookie, max_age=COOKIE_LIFETIME, httponly=True, samesite="strict",
            secure=self.secure or request.url.scheme == "https", path=_root(request),
        )  # fmt: skip
        return answer

    async def logout(self, request: Request) -> Response:
        visitor = await self.visitor(request)
        form = await _form(request)
        if visitor is None or not csrf_ok(visitor, _text(form.get("csrf"))):
            return self._refused(request, visitor)
        answer = self.to_login(request)
        answer.delete_cookie(COOKIE, path=_root(request))
        return answer

    # -- pages -----------------------------------------------------------------------------
    async def overview(self, request: Request) -> Response:
        visitor = await self.visitor(request)
        if visitor is None:
            return self.to_login(request)
        data = await run_in_threadpool(self.views.overview, visitor)
        return self.render("overview.html", request, visitor=visitor, page="overview", data=data)

    async def workers(self, request: Request) -> Response:
        visitor = await self.visitor(request)
        if visitor is None:
            return self.to_login(request)
        data = await run_in_threadpool(self.views.workers, visitor)
        return self.render("workers.html", request, visitor=visitor, page="workers", data=data)

    async def jobs(self, request: Request) -> Response:
        visitor = await self.visitor(request)
        if visitor is None:
            return self.to_login(request)
        try:
            form, where, before = await run_in_threadpool(self._filters, visitor, request)
        except ValueError as exc:
            return self.render("message.html", request, 400, visitor=visitor, page="jobs",
                               heading="Bad filter", message=str(exc))  # fmt: skip
        found, next_before = await run_in_threadpool(
            lambda: self.views.jobs(visitor, where, before=before)
        )
        return self.render(
            "jobs.html", request, visitor=visitor, page="jobs", form=form, jobs=found,
            next_before=next_before, before=before, query=_query(form), bulk_max=BULK_MAX,
        )  # fmt: skip

    def jobs_fragment(self, visitor: Visitor, request: Request) -> str:
        form, where, before = self._filters(visitor, request)
        found, next_before = self.views.jobs(visitor, where, before=before)
        return self.fragment(
            "_jobs.html", request, visitor=visitor, jobs=found, next_before=next_before,
            query=_query(form),
        )  # fmt: skip

    async def job(self, request: Request) -> Response:
        visitor = await self.visitor(request)
        if visitor is None:
            return self.to_login(request)
        job_id = _job_id(request.path_params["job_id"])
        view = None if job_id is None else await run_in_threadpool(self._job, visitor, job_id)
        if view is None:
            return self.render("message.html", request, 404, visitor=visitor, page="jobs",
                               heading="No such job", message=f"no job {job_id}")  # fmt: skip
        return self.render(
            "job.html", request, visitor=visitor, page="jobs", view=view, stream=[],
            last_seq=0, progress=None,
        )  # fmt: skip

    def _job(self, visitor: Visitor, job_id: int) -> Any:
        try:
            return self.views.job(visitor, job_id)
        except errors.JobNotFound:
            return None

    # -- filters -----------------------------------------------------------------------------
    def _filters(
        self, visitor: Visitor, request: Request
    ) -> tuple[dict[str, str], JobFilter, int | None]:
        """The jobs page's form as typed, the filter it makes, and the page's ``before``."""
        params = request.query_params
        form = {name: params.get(name, "").strip() for name in FILTERS}
        status = form["status"] or None
        if status is not None and status not in {s.value for s in Status}:
            raise ValueError(f"no status {status[:30]!r}")
        only: tuple[str, ...] | None = None
        hide: tuple[str, ...] | None = None
        if form["group"]:
            groups = self.visitors.groups()
            if form["group"] == access.DEFAULT_GROUP:
                hide = tuple(sorted(groups))
            else:
                only = tuple(sorted(q for q, g in groups.items() if g == form["group"]))
        now = self.views.cache.get("now", 1.0, self.views.store.now)
        where = JobFilter(
            queue=form["queue"] or None,
            task=form["task"] or None,
            status=status,
            key=form["key"] or None,
            since=_when(form["since"], now, "since"),
            until=_when(form["until"], now, "until"),
            only=only,
            hide=hide,
        )
        before = _job_id(params.get("before", ""))
        return form, where, before

    # -- actions ---------------------------------------------------------------------------
    async def confirm(self, request: Request) -> Response:
        visitor = await self.visitor(request)
        if visitor is None:
            return self.to_login(request)
        if not visitor.admin:
            return self._refused(request, visitor)
        params = request.query_params
        do = params.get("do", "")
        try:
            question, verb, fields, back = await run_in_threadpool(
                self._describe, visitor, request, do, params
            )
        except (ValueError, errors.JobNotFound) as exc:
            return self.render("message.html", request, 400, visitor=visitor,
                               heading="Nothing to do", message=str(exc))  # fmt: skip
        return self.render(
            "confirm.html", request, visitor=visitor, question=question, verb=verb,
            fields=fields, back=back, danger=do in ("cancel", "bulk-cancel", "pause"),
        )  # fmt: skip

    def _describe(
        self, visitor: Visitor, request: Request, do: str, params: Any
    ) -> tuple[str, str, list[tuple[str, str]], str]:
        root = _root(request)
        if do in ("cancel", "retry"):
            job_id = _job_id(params.get("job", ""))
            view = None if job_id is None else self.views.job(visitor, job_id)
            if view is None:
                raise ValueError(f"no job {params.get('job', '')[:20]!r}")
            job = view.job
            question = f"{do.capitalize()} job {job.id} ({job.task}, {job.status.value})?"
            return (
                question,
                f"{do.capitalize()} job {job.id}",
                [("do", do), ("job", str(job.id))],
                f"{root}jobs/{job.id}",
            )
        if do in ("pause", "resume"):
            queue = payload.check_queue(params.get("queue", ""))
            question = (
                f"Pause queue {queue}? Workers claim none of its jobs until it is resumed; "
                "the jobs running there run on."
                if do == "pause"
                else f"Resume queue {queue}? Workers claim its jobs again."
            )
            return question, f"{do.capitalize()} {queue}", [("do", do), ("queue", queue)], root
        if do in ("bulk-retry", "bulk-cancel"):
            form, where, _ = self._filters(visitor, request)
            count = len(self._bulk_ids(visitor, where, do))
            verb = "retry" if do == "bulk-retry" else "cancel"
            more = "+" if count >= BULK_MAX else ""
            question = f"{verb.capitalize()} {count}{more} job(s) that this filter finds?"
            fields = [("do", do), *[(k, v) for k, v in form.items() if v]]
            return (
                question,
                f"{verb.capitalize()} {count}{more} job(s)",
                fields,
                f"{root}jobs?{_query(form)}",
            )
        raise ValueError(f"unknown action {do[:30]!r}")

    def _bulk_ids(self, visitor: Visitor, where: JobFilter, do: str) -> list[int]:
        wanted = (
            {"pending", "running"} if do == "bulk-cancel" else {"failed", "timed_out", "cancelled"}
        )
        ids: list[int] = []
        for job in self._walk(visitor, where):
            if job.status.value in wanted:
                ids.append(job.id)
                if len(ids) >= BULK_MAX:
                    break
        return ids

    def _walk(self, visitor: Visitor, where: JobFilter) -> Iterator[Any]:
        before: int | None = None
        while True:
            found, before = self.views.jobs(visitor, where, before=before, limit=1000)
            yield from found
            if before is None:
                return

    async def act(self, request: Request) -> Response:
        visitor = await self.visitor(request)
        form = await _form(request)
        if visitor is None or not visitor.admin or not csrf_ok(visitor, _text(form.get("csrf"))):
            return self._refused(request, visitor)
        fields = {k: _text(v) or "" for k, v in form.items()}
        try:
            message, back = await run_in_threadpool(self._do, visitor, request, fields)
        except (ValueError, errors.JobNotFound, errors.InvalidTransition) as exc:
            return self.render("message.html", request, 409, visitor=visitor,
                               heading="Not done", message=str(exc))  # fmt: skip
        answer = RedirectResponse(back, status_code=303)
        answer.set_cookie(
            "plunder_notice", message[:200], max_age=30, path=_root(request), httponly=True,
            samesite="strict", secure=self.secure or request.url.scheme == "https",
        )  # fmt: skip
        return answer

    def _do(self, visitor: Visitor, request: Request, fields: dict[str, str]) -> tuple[str, str]:
        root, do, store = _root(request), fields.get("do", ""), self.views.store
        if do in ("cancel", "retry"):
            job_id = _job_id(fields.get("job", ""))
            if job_id is None or self.views.job(visitor, job_id) is None:
                raise ValueError(f"no job {fields.get('job', '')[:20]!r}")
            job = store.job_cancel(job_id) if do == "cancel" else store.job_retry(job_id)
            return f"job {job.id}: {job.status.value}", f"{root}jobs/{job.id}"
        if do in ("pause", "resume"):
            queue = payload.check_queue(fields.get("queue", ""))
            pauses = self.views.pauses
            done = pauses.queue_pause(queue) if do == "pause" else pauses.queue_resume(queue)
            self.views.cache.get("paused", 0.0, self.views.paused_queues)  # shown at once
            state = "paused" if do == "pause" else "resumed"
            return f"queue {queue} {state if done else 'unchanged'}", root
        if do in ("bulk-retry", "bulk-cancel"):
            return self._bulk(visitor, fields, do), f"{root}jobs"
        raise ValueError(f"unknown action {do[:30]!r}")

    def _bulk(self, visitor: Visitor, fields: dict[str, str], do: str) -> str:
        store = self.views.store
        act = store.job_cancel if do == "bulk-cancel" else store.job_retry
        done = skipped = 0
        for job_id in self._bulk_ids(visitor, self._bulk_filter(visitor, fields), do):
            try:
                act(job_id)
                done += 1
            except errors.InvalidTransition:  # it moved on since it was read
                skipped += 1
        verb = "cancelled" if do == "bulk-cancel" else "retried"
        return f"{done} job(s) {verb}, {skipped} had moved on"

    def _bulk_filter(self, visitor: Visitor, fields: dict[str, str]) -> JobFilter:
        class _Params:  # the posted filter, read as the jobs page reads its query
            query_params = {k: v for k, v in fields.items() if k in FILTERS}

        _, where, _ = self._filters(visitor, _Params())  # type: ignore[arg-type]
        return where

    def _refused(self, request: Request, visitor: Visitor | None) -> Response:
        message = "only an admin key may act, from a form of this dashboard (reload it)"
        return self.render(
            "message.html", request, 403, visitor=visitor, heading="Refused", message=message
        )


_NO_CACHE = {"Cache-Control": "no-store", "X-Frame-Options": "DENY"}


def _root(request: Request) -> str:
    return str(request.scope.get("root_path", "")) + "/"


async def _form(request: Request) -> dict[str, str]:
    """A posted form (application/x-www-form-urlencoded, the only kind these pages
    send), at most MAX_FORM bytes; the last value of a repeated field."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            return {}
    try:
        return dict(parse_qsl(body.decode("utf-8"), max_num_fields=100))
    except (UnicodeDecodeError, ValueError):
        return {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _job_id(raw: str) -> int | None:
    raw = str(raw).strip()
    if not raw.isdigit() or len(raw) > 18 or int(raw) < 1:
        return None
    return int(raw)


def _query(form: dict[str, str]) -> str:
    return urlencode({k: v for k, v in form.items() if v})


def _when(text: str, now: datetime, name: str) -> float | None:
    """``15m`` (that long ago, by the database clock) or an ISO time (UTC unless it
    says), as seconds since the epoch."""
    if not text:
        return None
    try:
        return now.timestamp() - access.lifetime(text)
    except errors.ConfigError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{name}: {text[:40]!r} is neither a span (15m) nor a time") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
