#!/usr/bin/env python3
"""The sample shop's manage.py: `migrate`, `runserver`, `plunder_worker`, `plunder …`."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
