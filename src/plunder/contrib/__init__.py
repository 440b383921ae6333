"""Integrations with the frameworks plunder's users already run: Django's tasks framework
(``plunder.contrib.django``), Starlette and FastAPI (``plunder.contrib.starlette``,
``plunder.contrib.fastapi``). Each imports its framework; plunder itself does not."""
