"""The dashboard as a person uses it, in headless Chromium: the overview follows a drain,
a job page shows its tokens as they are streamed, a cancel from the page stops the job,
a reader sees no action, a group's key sees only its group."""

from __future__ import annotations

import time
from typing import Any

import pytest

from plunder.model import JobSpec
from plunder.states import Status
from tests.browser.conftest import Farm, log_in

pytestmark = pytest.mark.browser


def wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


def test_the_overview_follows_a_drain_without_reloading(browser: Any, farm: Farm) -> None:
    log_in(browser, farm, farm.admin)
    browser.evaluate("window.loadedOnce = true")  # gone if the page reloads
    cell = browser.locator('tr[data-queue="drain"] td[data-status="succeeded"]')
    total = 3000  # 5 ms each on 8 slots: seconds to drain, several overview updates
    farm.store.job_enqueue_many([JobSpec("noop", [i, 0.005], queue="drain") for i in range(total)])
    seen: list[int] = []

    def counted() -> bool:
        if cell.count():
            value = int(cell.inner_text().strip() or 0)
            if not seen or value != seen[-1]:
                seen.append(value)
        return bool(seen) and seen[-1] >= total

    wait_for(counted, 30, f"the overview to count {total} succeeded jobs")
    assert browser.evaluate("window.loadedOnce") is True
    assert len(seen) >= 2 and seen == sorted(seen)  # it moved as the queue drained
    sparkline = browser.locator('tr[data-queue="drain"] svg.spark polyline')
    assert sparkline.count() == 2  # throughput and wait, drawn by the server


def test_a_job_page_shows_its_tokens_as_they_are_streamed(browser: Any, farm: Farm) -> None:
    log_in(browser, farm, farm.admin)
    (job,) = farm.store.job_enqueue_many([JobSpec("tokens", [8, 0.4], queue="llm")])
    browser.goto(f"{farm.url}/jobs/{job.id}")
    stream = browser.locator("#stream")
    wait_for(lambda: "tok1 " in stream.inner_text(), 20, "the first tokens")
    early = stream.inner_text()
    assert "tok7" not in early  # shown while the job still streams
    assert farm.store.job_get(job.id).status == Status.RUNNING
    wait_for(lambda: "tok7 " in stream.inner_text(), 20, "the last token")
    wait_for(lambda: browser.locator("#status").inner_text() == "succeeded", 10, "success")
    assert stream.inner_text().split() == [f"tok{i}" for i in range(8)]


def test_a_cancel_from_the_job_page_stops_the_running_job(browser: Any, farm: Farm) -> None:
    marker = farm.folder / "stopped"
    (job,) = farm.store.job_enqueue_many([JobSpec("sleepy", [str(marker)])])
    wait_for(lambda: farm.store.job_get(job.id).status == Status.RUNNING, 20, "it to run")
    log_in(browser, farm, farm.admin)
    browser.goto(f"{farm.url}/jobs/{job.id}")
    browser.click("#cancel")
    assert f"Cancel job {job.id}" in browser.locator("p.confirm").inner_text()
    browser.click("#confirm")
    browser.wait_for_url(f"{farm.url}/jobs/{job.id}")
    assert browser.locator("#status").inner_text() == "cancelled"
    wait_for(marker.exists, 15, "the task to see its cancellation and stop")
    assert farm.store.job_get(job.id).status == Status.CANCELLED


def test_a_reader_sees_no_action_buttons(browser: Any, farm: Farm) -> None:
    (job,) = farm.store.job_enqueue_many([JobSpec("noop", [1], queue="held", delay=3600)])
    log_in(browser, farm, farm.reader)
    for path in ("/", "/workers", "/jobs", f"/jobs/{job.id}"):
        browser.goto(farm.url + path)
        assert browser.locator("a.button, #cancel, #retry, #confirm").count() == 0, path
    assert "pending" in browser.locator("#status").inner_text()
    answer = browser.request.post(farm.url + "/act", form={"do": "cancel", "job": str(job.id)})
    assert answer.status == 403
    assert farm.store.job_get(job.id).status == Status.PENDING


def test_a_group_key_sees_only_its_group(browser: Any, farm: Farm) -> None:
    mine, theirs = farm.store.job_enqueue_many(
        [JobSpec("tokens", [1, 0], queue="llm"), JobSpec("noop", [2], queue="drain")]
    )
    log_in(browser, farm, farm.gpu_reader)
    wait_for(lambda: _queues(browser, farm) == ["llm"], 10, "only llm on the overview")
    browser.goto(farm.url + "/jobs")
    shown = {int(i) for i in browser.locator("tr[data-job]").evaluate_all(
        "rows => rows.map(r => r.dataset.job)")}  # fmt: skip
    assert mine.id in shown and theirs.id not in shown
    browser.goto(f"{farm.url}/jobs/{theirs.id}")
    assert "No such job" in browser.locator("h1").inner_text()


def _queues(page: Any, farm: Farm) -> list[str]:
    page.goto(farm.url + "/")
    return sorted(
        page.locator("tr[data-queue]").evaluate_all("rows => rows.map(r => r.dataset.queue)")
    )


def test_the_pages_fit_a_phone(chromium: Any, farm: Farm) -> None:
    context = chromium.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    try:
        page = context.new_page()
        log_in(page, farm, farm.admin)
        for path in ("/", "/workers", "/jobs"):
            page.goto(farm.url + path)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{path} is {width}px wide"  # wide tables scroll inside
    finally:
        context.close()
