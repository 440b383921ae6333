from django.urls import path

from orders import views

urlpatterns = [
    path("orders/", views.place_order),
    path("jobs/<str:result_id>/", views.job_result),
    path("jobs/<str:result_id>/stream", views.job_stream),
]
