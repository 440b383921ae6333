from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    quantity = models.IntegerField()
    receipt_job = models.CharField(max_length=20, blank=True)
