"""bench.tasks' app plus scenario 14's tasks, one on a fair queue: apart from bench.tasks,
so that the workers of the other scenarios (``-A bench.tasks:app``, every queue of the
app) serve no fair queue, whose claims take a slower path."""

from __future__ import annotations

from bench.tasks import app

__all__ = ["app", "tenant", "tenant_plain"]


@app.task(name="bench.tenant", queue="bench_fair", fair=True, retries=0)
def tenant(group: str, i: int) -> int:
    """Scenario 14: a tenant's no-op on a fair queue (its group set at enqueue)."""
    return i


@app.task(name="bench.tenant_plain", queue="bench_plain", retries=0)
def tenant_plain(group: str, i: int) -> int:
    """Scenario 14: the same on a queue that is not fair."""
    return i
