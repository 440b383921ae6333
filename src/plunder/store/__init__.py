"""Where plunder's state lives: the :class:`~plunder.store.base.Store` seam and its drivers."""

from plunder.store.base import Store
from plunder.store.connect import open_store

__all__ = ["Store", "open_store"]
