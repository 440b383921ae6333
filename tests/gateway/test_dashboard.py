"""The dashboard as the gateway serves it, over plain HTTP: logins, roles, groups, CSRF and
actions (the browser tests, in tests/browser, drive the same pages in Chromium)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import httpx

from plunder.model import JobSpec
from plunder.states import Status
from plunder.store import Store, pauses
from tests.gateway.conftest import Keys
from tests.support import gateway as support


@contextlib.contextmanager
def login(gateway: support.Gateway, secret: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=30) as browser:
        answer = browser.post("/login", data={"secret": secret})
        assert answer.status_code == 303, answer.text
        yield browser


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None, html
    return found.group(1)


def test_a_visitor_logs_in_with_a_key_and_a_worker_key_is_refused(
    gateway: support.Gateway, keys: Keys
) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30) as anonymous:
        first = anonymous.get("/")
        assert first.status_code == 303 and first.headers["location"].endswith("/login")
        assert anonymous.get("/live/overview").text.startswith("event: end")
        for secret, why in (
            (keys.worker, "may not read"),
            ("plk_000000000000_nope", "not a valid API key"),
        ):
            refused = anonymous.post("/login", data={"secret": secret})
            assert refused.status_code == 401 and why in refused.text
    with login(gateway, keys.reader) as reader:
        cookie = reader.cookies.get("plunder_dash") or ""
        assert keys.reader not in cookie  # the secret is never kept
        page = reader.get("/")
        assert page.status_code == 200 and "Overview" in page.text
        assert reader.get("/workers").status_code == 200


def test_the_workers_page_shows_a_session_s_labels_and_free_slots(
    gateway: support.Gateway, keys: Keys, store: Store
) -> None:
    store.session_open(
        name="gpu-1", host="h", pid=7, queues=["default"], expiry=60, free_slots=3,
        labels=["gpu=a100", "model=llama3-70b"],
    )  # fmt: skip
    with login(gateway, keys.admin) as admin:
        page = admin.get("/workers").text
    row = page[page.index("gpu-1") :].split("</tr>")[0]
    assert "<code>gpu=a100</code>" in row and "<code>model=llama3-70b</code>" in row
    assert '<td class="num">3</td>' in row


def test_a_reader_sees_no_action_and_its_posts_are_refused(
    gateway: support.Gateway, keys: Keys, store: Store
) -> None:
    (job,) = store.job_enqueue_many([JobSpec("t.echo", queue="default")])
    with login(gateway, keys.reader) as reader:
        page = reader.get(f"/jobs/{job.id}")
        assert page.status_code == 200 and 'id="cancel"' not in page.text
        assert "confirm?do=" not in reader.get("/jobs").text
        assert reader.get(f"/confirm?do=cancel&job={job.id}").status_code == 403
        csrf = csrf_of(page.text)  # its logout form's: a valid token, still no action
        refused = reader.post("/act", data={"do": "cancel", "job": job.id, "csrf": csrf})
        assert refused.status_code == 403
    assert store.job_get(job.id).status == Status.PENDING


def test_an_admin_cancels_after_confirming_and_a_post_without_its_token_is_refused(
    gateway: support.Gateway, keys: Keys, store: Store
) -> None:
    a, b = store.job_enqueue_many([JobSpec("t.echo"), JobSpec("t.echo")])
    with login(gateway, keys.admin) as admin:
        confirm = admin.get(f"/confirm?do=cancel&job={a.id}")
        assert confirm.status_code == 200 and f"Cancel job {a.id}" in confirm.text
        csrf = csrf_of(confirm.text)
        forged = admin.post("/act", data={"do": "cancel", "job": a.id, "csrf": "0" * 64})
        assert forged.status_code == 403
        assert store.job_get(a.id).status == Status.PENDING
        done = admin.post("/act", data={"do": "cancel", "job": a.id, "csrf": csrf})
        assert done.status_code == 303
        assert store.job_get(a.id).status == Status.CANCELLED
        bulk = admin.get("/confirm?do=bulk-retry&status=cancelled")
        assert "Retry 1 job(s)" in bulk.text
        form = dict(re.findall(r'name="(\w+)" value="([^"]*)"', bulk.text))
        assert admin.post("/act", data=form).status_code == 303
        assert store.job_get(a.id).status == Status.PENDING
        pause = admin.post("/act", data={"do": "pause", "queue": "default", "csrf": csrf})
        assert pause.status_code == 303
        assert [p.queue for p in pauses.of(store).queue_pause_list()] == ["default"]
        assert "paused" in admin.get("/").text
    assert store.job_get(b.id).status == Status.PENDING


def test_a_group_key_sees_only_its_groups_jobs(
    gateway: support.Gateway, keys: Keys, store: Store
) -> None:
    mine, theirs = store.job_enqueue_many([JobSpec("t.gen", queue="llm"), JobSpec("t.echo")])
    with login(gateway, keys.gpu_producer) as gpu:
        listed = gpu.get("/jobs").text
        assert f'data-job="{mine.id}"' in listed and f'data-job="{theirs.id}"' not in listed
        assert gpu.get(f"/jobs/{theirs.id}").status_code == 404
        assert gpu.get(f"/jobs/{mine.id}").status_code == 200
        overview = gpu.get("/").text
        assert 'data-queue="llm"' in overview and 'data-queue="default"' not in overview
        asked = gpu.get("/jobs?queue=default").text  # asking for it shows nothing either
        assert f'data-job="{theirs.id}"' not in asked
    with login(gateway, keys.admin) as admin:  # every group, or one by the filter
        listed = admin.get("/jobs").text
        assert f'data-job="{theirs.id}"' in listed and f'data-job="{mine.id}"' in listed
        gpu_only = admin.get("/jobs?group=gpu").text
        assert f'data-job="{mine.id}"' in gpu_only and f'data-job="{theirs.id}"' not in gpu_only
        default = admin.get("/jobs?group=default").text
        assert f'data-job="{theirs.id}"' in default and f'data-job="{mine.id}"' not in default
    with login(gateway, keys.reader) as reader:  # the default group's reader: not llm
        listed = reader.get("/jobs").text
        assert f'data-job="{theirs.id}"' in listed and f'data-job="{mine.id}"' not in listed


def test_a_revoked_keys_cookie_stops_working_within_a_second(
    gateway: support.Gateway, keys: Keys, store: Store
) -> None:
    key_id = keys.reader.split("_")[1]
    with login(gateway, keys.reader) as reader:
        assert reader.get("/jobs").status_code == 200
        store.key_revoke(key_id)
        deadline = time.monotonic() + 10
        while reader.get("/jobs").status_code == 200:
            assert time.monotonic() < deadline, "the revoked key's cookie still works"
            time.sleep(0.1)
        assert reader.get("/jobs").headers["location"].endswith("/login")
        tampered = reader.cookies.get("plunder_dash") or ""
    with httpx.Client(base_url=gateway.url, timeout=30) as other:
        admin_id = keys.admin.split("_")[1]
        forged = admin_id + tampered[len(key_id) :]  # another key's id, this signature
        other.cookies.set("plunder_dash", forged)
        assert other.get("/").status_code == 303
