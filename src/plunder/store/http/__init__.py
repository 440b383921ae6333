"""The store through a gateway (``http://`` and ``https://`` URLs): the worker protocol
(HttpLink) and the producer's store (HttpStore), over httpx."""

from plunder.store.http.client import Client
from plunder.store.http.link import HttpLink
from plunder.store.http.store import HttpStore

__all__ = ["Client", "HttpLink", "HttpStore"]
