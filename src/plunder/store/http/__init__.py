"""The store through a gateway (``http://`` and ``https://`` URLs): the worker protocol
(HttpLink) and the producer's store (HttpStore), over kept HTTP/1.1 connections
(plunder.store.http.lines; httpx for server-sent event streams)."""

from plunder.store.http.client import Client
from plunder.store.http.link import HttpLink
from plunder.store.http.store import HttpStore

__all__ = ["Client", "HttpLink", "HttpStore"]
