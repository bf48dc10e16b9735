"""Requests whose reply comes later.

A handler that will answer later (a long-poll FETCH, a PRODUCE waiting for its fdatasync or its
replicas, a request passed on to another node or to etcd) raises :class:`Deferred`: the broker
then sends nothing now, and whoever holds the request answers it once it can.
"""

from __future__ import annotations


class Deferred(Exception):
    """Raised by a handler that will reply later (long poll, fsync before ack)."""
