"""The shop's tasks: plain Django tasks (``django.tasks``, or the django-tasks backport on
Django 5.2); plunder runs them."""

import os
import time
from pathlib import Path

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

from orders.models import Order
from plunder.contrib.django import current_context


@task(queue_name="emails", priority=10, takes_context=True)
def send_receipt(context, order_id: int) -> str:
    order = Order.objects.get(id=order_id)
    return f"receipt for {order.quantity} x {order.item} (attempt {context.attempt})"


@task
def pack(order_id: int, marker: str = "") -> str:
    """Packs slowly: a marker file says it started (the kill test waits for it)."""
    if marker:
        Path(marker + f".{os.getpid()}").write_text("started")
    time.sleep(float(os.environ.get("SHOP_PACK_SECONDS", "0")))
    return f"packed {order_id}"


@task
def count_to(n: int) -> int:
    """Streams each number to the job's subscribers (the stream page relays them)."""
    ctx = current_context()
    for i in range(1, n + 1):
        ctx.stream(i)
    return sum(range(n + 1))
