"""Place an order (the order and its receipt job commit together, or neither does), read
a job's result, and stream a job's output as server-sent events."""

import json

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from orders.models import Order
from orders.tasks import send_receipt

try:
    from django.tasks import default_task_backend
except ImportError:
    from django_tasks import default_task_backend


@csrf_exempt
def place_order(request: HttpRequest) -> HttpResponse:
    body = json.loads(request.body)
    try:
        with transaction.atomic():
            order = Order.objects.create(item=body["item"], quantity=body["quantity"])
            result = send_receipt.enqueue(order.id)  # in this transaction
            order.receipt_job = result.id
            order.save()
            if body.get("fail"):  # the order, and so its job, roll back
                raise ValueError("payment refused")
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=402)
    return JsonResponse({"order": order.id, "job": result.id}, status=201)


def job_result(request: HttpRequest, result_id: str) -> HttpResponse:
    result = default_task_backend.get_result(result_id)
    body = {"status": str(result.status), "attempts": result.attempts}
    if result.status == "SUCCESSFUL":
        body["return_value"] = result.return_value
    return JsonResponse(body)


def job_stream(request: HttpRequest, result_id: str) -> HttpResponse:
    """The job's stream events, then its end, as server-sent events."""
    job = default_task_backend.app.job(int(result_id))

    def events():
        for event in job.stream(timeout=30):
            yield f"event: {event.kind}\ndata: {json.dumps(event.data)}\n\n"
        yield f"event: end\ndata: {json.dumps(job.record.status.value)}\n\n"

    return StreamingHttpResponse(events(), content_type="text/event-stream")
