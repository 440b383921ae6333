from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("item", models.CharField(max_length=100)),
                ("quantity", models.IntegerField()),
                ("receipt_job", models.CharField(blank=True, max_length=20)),
            ],
        ),
    ]
