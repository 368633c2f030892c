"""halfcast/core/broker/redis_transport.py: closing a collected connection that holds unacknowledged messages does not raise.

When the Redis connection drops, Celery's consumer runs ``connection.collect()``, then
``connection.close()`` (``on_connection_error_after_connected``). The collect's own
close of the channel fails on the dead socket, so the collect detaches the
transport from its settings while the channel is still open; the close then closes
the channel and gives its unacknowledged messages back. The tests reach that state
with the live Redis by detaching the transport the way the collect does. With
kombu's own transport the close raises
``AttributeError: 'NoneType' object has no attribute 'hostname'``, which Celery
treats as unrecoverable (the worker exits); the test shows that too, so it notices
when kombu fixes it. Runs against the real Redis, in a queue of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from kombu import Connection, Exchange, Message, Queue

from halfcast.core.broker.redis_transport import TRANSPORT_PATH

pytestmark = pytest.mark.redis


@pytest.fixture
def queue(redis_url: str) -> Iterator[Queue]:
    name = f"transport-test-{uuid.uuid4().hex[:8]}"
    yield Queue(name, Exchange(name), routing_key=name)
    client = redis.Redis.from_url(redis_url)
    client.delete(name)
    for tag, payload in client.hgetall("unacked").items():  # only this test's messages
        if name.encode() in payload:
            client.hdel("unacked", tag)
            client.zrem("unacked_index", tag)


def _take_unacked(connection: Connection, queue: Queue) -> Message:
    """Publish one message and receive it without acknowledging it."""
    with connection.Producer() as producer:
        producer.publish({"job": 1}, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue])
    received = []
    with connection.Consumer(queue, callbacks=[lambda body, message: received.append(message)]):
        connection.drain_events(timeout=5)
    assert len(received) == 1 and not received[0].acknowledged
    return received[0]


def _detach_then_close(connection: Connection) -> None:
    """What the consumer does to a dropped connection: the collect detaches the transport, then the close."""
    connection._do_close_transport()  # the end of Connection.collect(), after its failed channel close
    connection.close()


def test_kombus_own_transport_raises_on_close_after_a_dropped_connection(redis_url: str, queue: Queue) -> None:
    connection = Connection(redis_url)
    _take_unacked(connection, queue)
    with pytest.raises(AttributeError, match="hostname"):
        _detach_then_close(connection)


def test_halfcasts_transport_closes_a_dropped_connection_quietly_and_keeps_the_message(
    redis_url: str, queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    connection = Connection(redis_url, transport=TRANSPORT_PATH)
    _take_unacked(connection, queue)
    _detach_then_close(connection)
    assert "1 unacknowledged message(s)" in caplog.text
    unacked = redis.Redis.from_url(redis_url).hvals("unacked")
    assert any(queue.name.encode() in payload for payload in unacked)  # delivered again after the visibility timeout


def test_a_live_connection_still_gives_its_unacknowledged_messages_back(redis_url: str, queue: Queue) -> None:
    connection = Connection(redis_url, transport=TRANSPORT_PATH)
    _take_unacked(connection, queue)
    connection.close()  # a clean close: kombu's own restore runs
    assert redis.Redis.from_url(redis_url).llen(queue.name) == 1


def test_the_task_acks_its_message_after_the_connection_was_dropped_without_raising(
    redis_url: str, queue: Queue
) -> None:
    """The task that took the message claims its job after the reconnect and acknowledges it on the dead channel."""
    connection = Connection(redis_url, transport=TRANSPORT_PATH)
    message = _take_unacked(connection, queue)
    _detach_then_close(connection)
    message.ack()
    assert message.acknowledged


def test_kombus_own_transport_raises_on_that_ack(redis_url: str, queue: Queue) -> None:
    connection = Connection(redis_url)
    message = _take_unacked(connection, queue)
    with pytest.raises(AttributeError):
        _detach_then_close(connection)
    with pytest.raises(AttributeError):  # in Celery's event loop: an unrecoverable error, the worker exits
        message.ack()
