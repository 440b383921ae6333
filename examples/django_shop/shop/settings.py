"""A sample Django project whose tasks run on plunder. The database is SHOP_DATABASE_URL
(sqlite:///path or postgresql://user@host:port/name; default: shop.db here): plunder's
tables live beside the shop's, so an order and its receipt job commit together."""

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "sample-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "shop.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "plunder.contrib.django",  # manage.py plunder_worker, manage.py plunder …
    "orders",
]


def _database(url: str) -> dict[str, object]:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": parts.path[1:]}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "localhost",
        "PORT": str(parts.port or ""),
    }


DATABASES = {
    "default": _database(os.environ.get("SHOP_DATABASE_URL", f"sqlite:///{BASE_DIR / 'shop.db'}"))
}

PLUNDER_TASKS = {
    "default": {
        "BACKEND": "plunder.contrib.django.PlunderBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "SESSION_EXPIRY": float(os.environ.get("PLUNDER_SESSION_EXPIRY", "5")),
            "TASK_OPTIONS": {"retries": 2, "backoff_base": 0.1},
        },
    }
}

# SHOP_TASKS=reference: the reference database backend (django-tasks-db and its db_worker)
# instead, for comparison
if os.environ.get("SHOP_TASKS") == "reference":
    import django

    # Django 6 has django.tasks; on 5.2 the backport is an app of its own
    INSTALLED_APPS += (
        ["django_tasks_db"] if django.VERSION >= (6,) else ["django_tasks", "django_tasks_db"]
    )
    TASKS = {
        "default": {
            "BACKEND": "django_tasks_db.DatabaseBackend",
            "QUEUES": ["default", "emails"],
        }
    }
else:
    TASKS = PLUNDER_TASKS
