"""A fix in kombu's Redis transport so the worker survives a broker restart (kombu <= 5.7.0).

The bug (docs/reliability.md, ``redis`` row of the fault table): when the Redis connection
drops while the worker holds unacknowledged messages (late acks) *and* waits in ``BRPOP``
for more (a free pool slot), the consumer closes the broken connection twice:

1. ``Connection.collect()`` closes the channel; ``redis.Channel.close()`` first reads the
   pending ``BRPOP`` reply, that read raises ``ConnectionError`` (the server is gone) and the
   close stops there: the channel stays open, its unacknowledged messages unrestored.
   ``collect()`` swallows the error and then drops the transport's link to its connection
   (``transport.client = None``).
2. ``Connection.close()`` closes the same channel again; this time it gets as far as
   restoring the unacknowledged messages, which builds a Redis client from
   ``transport.client`` -- now ``None`` -- and fails with ``AttributeError: 'NoneType'
   object has no attribute 'hostname'``. That is not a connection error, so it escapes the
   consumer's reconnect loop: Celery logs ``Unrecoverable error`` and shuts the worker down.

The overrides, installed on kombu's Redis (and Sentinel) transport by :func:`install`:

* ``close()`` finishes the close when reading the pending ``BRPOP`` reply, or deleting the
  channel's auto-delete fanout queues (Celery's gossip), fails with a connection error
  (nothing more can be done on a dead connection), so the restore runs while the transport
  still knows its connection: the messages go back to their queue if Redis is reachable,
  and if it is not they stay in Redis' ``unacked`` index and come back through kombu's
  visibility-timeout restore.
* ``_connparams()`` (what every new client of a channel is built from) raises a
  ``redis.ConnectionError`` instead of the ``AttributeError`` once the channel's transport
  lost its connection: whatever still uses such a channel (a second close, the late ack of a
  task that was running while Redis was down) fails with the error kombu and Celery treat
  as a lost connection -- logged, then reconnect.

No released celery/kombu fixes this (celery 5.7.0 / kombu 5.7.0 are the newest; the
upstream reports of this class of bug are celery/celery#10205 and #10302).
"""

from __future__ import annotations

import logging
from queue import Empty
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

log = logging.getLogger(__name__)


class BrokerConnectionClosed(redis.exceptions.ConnectionError):
    """A channel whose broker connection was already closed was asked for a new client."""


class _SurviveBrokerLoss:
    """The overrides, mixed into kombu's Redis channel classes."""

    connection: Any
    closed: bool
    connection_errors: tuple[type[BaseException], ...]

    def close(self) -> None:
        if getattr(self, "_in_poll", None) and not self.closed:
            try:
                self._brpop_read()  # type: ignore[attr-defined]  # resets _in_poll whatever happens
            except Empty:
                pass
            except self.connection_errors as exc:
                log.debug("BRPOP reply lost with the broker connection (%r); closing the channel anyway", exc)
        super().close()  # type: ignore[misc]

    def queue_delete(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().queue_delete(queue, *args, **kwargs)  # type: ignore[misc]
        except self.connection_errors as exc:
            if not getattr(self, "_closing", False):
                raise
            # close() deletes the channel's auto-delete fanout queues first; on a dead
            # connection that fails, and kombu would stop the close there.
            log.debug("auto-delete queue %s not deleted, the broker connection is lost (%r)", queue, exc)
            return None

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or getattr(transport, "client", None) is None:
            raise BrokerConnectionClosed("the broker connection of this channel is already closed")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)  # type: ignore[misc]
        return params


class Channel(_SurviveBrokerLoss, kombu_redis.Channel):
    """kombu's Redis channel with the fix."""


class SentinelChannel(_SurviveBrokerLoss, kombu_redis.SentinelChannel):
    """kombu's Redis Sentinel channel with the fix."""


def install() -> None:
    """Make kombu's ``redis://``/``rediss://`` and ``sentinel://`` transports use the fixed channels.

    Swapping the transports' channel class (rather than naming a transport class of our
    own in ``broker_transport``) keeps kombu's URL handling, e.g. TLS for ``rediss://``.
    Idempotent.
    """
    kombu_redis.Transport.Channel = Channel
    kombu_redis.SentinelTransport.Channel = SentinelChannel
