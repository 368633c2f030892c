"""kombu's Redis transport, made to survive a broker restart while messages are unacknowledged.

When the connection to Redis drops, Celery's consumer collects the broker
connection (which detaches the transport from its connection settings) and then
closes it; closing the channel gives its unacknowledged messages back, and to do
that kombu builds a new Redis client from settings that are gone by then:
``AttributeError: 'NoneType' object has no attribute 'hostname'``. Celery treats
that as an unrecoverable error and the worker exits, after its running jobs finish.

The same holds later for the acknowledgement of such a message: its task goes on
after the reconnect, claims its job and acknowledges the message on the channel
that is gone. kombu then raises the same kind of ``AttributeError`` inside Celery's
event loop, which kills the worker too.

A worker here holds an unacknowledged message only while the task that took it is
executing (prefetch is off, see :mod:`halfcast.core.broker.celery_app`), and that task still runs
after the reconnect: it claims the job or hands the message back itself. So there is
nothing to give back, and nothing to acknowledge, through a connection that is
already gone: :class:`QoS` skips the restore, the ack and the reject of a channel
whose connection was torn down (and logs it) instead of raising. The messages stay
where Redis keeps them: a Redis that kept its data delivers them again after the
visibility timeout (a duplicate is dropped by the claim's compare-and-set), and a
Redis that lost them is repaired from the database (:mod:`worker.messages.broker_watch`).
Everything on a live connection is kombu's own.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis

log = logging.getLogger(__name__)

#: What ``broker_transport`` names to use this transport.
TRANSPORT_PATH = "halfcast.core.broker.redis_transport:Transport"


class QoS(redis.QoS):
    """Redis QoS whose restore, ack and reject are no-ops once the channel's connection was torn down."""

    def _connection_gone(self) -> bool:
        transport = getattr(self.channel, "connection", None)
        return transport is None or transport.client is None

    def restore_unacked(self, client: Any = None) -> None:
        """Give the unacknowledged messages back to their queues, unless the broker connection was torn down."""
        if client is None and self._connection_gone():
            assert self._delivered is not None  # set by QoS.__init__ (kombu declares it None on the class)
            log.warning(
                "broker connection lost with %d unacknowledged message(s): their tasks still run and claim or hand "
                "back their jobs; a redelivery after the visibility timeout is dropped",
                len(self._delivered),
            )
            self._delivered.clear()
            return
        super().restore_unacked(client)

    def ack(self, delivery_tag: str) -> None:
        """Acknowledge the message, unless it came through a broker connection that was torn down."""
        if self._connection_gone():
            log.info("message %s came through a broker connection that is gone: not acknowledged", delivery_tag)
            return
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """Reject the message, unless it came through a broker connection that was torn down."""
        if self._connection_gone():
            log.info("message %s came through a broker connection that is gone: not rejected", delivery_tag)
            return
        super().reject(delivery_tag, requeue=requeue)


class Channel(redis.Channel):
    """kombu's Redis channel with :class:`QoS`."""

    QoS = QoS


class Transport(redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel
