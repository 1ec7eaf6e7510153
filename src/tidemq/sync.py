"""Synchronous twins of the asyncio clients, for scripts, notebooks and threads.

```python
from tidemq.sync import Producer, PullConsumer, PushConsumer, Message
with Producer("pg", namesrv="127.0.0.1:9876") as producer:
    result = producer.send(Message("Orders", b"hello"))

consumer = PushConsumer("cg", namesrv="127.0.0.1:9876")
consumer.subscribe("Orders", "*")
consumer.listener(lambda messages: print(messages))   # runs in a thread pool
consumer.start()
```

Each twin wraps the asyncio client of the same name (``tidemq.client``) and runs it on a private
event loop in one background daemon thread that all twins of the process share (started on
first use, uvloop when available). A call hands its coroutine to that loop and blocks until it
finishes; methods, arguments, results and errors are those of the asyncio client. Twins may be
used from any thread, also from inside a running event loop (a notebook) since the work happens
on the private loop. ``send_async`` returns a ``concurrent.futures.Future`` for callers that
want many sends in flight without asyncio.

Calling a twin from the private loop's own thread (e.g. from a callback running there) would
wait on itself forever, so it raises RuntimeError instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from tidemq.client import admin as _admin
from tidemq.client import admin_groups as _admin_groups
from tidemq.client import admin_messages as _admin_messages
from tidemq.client import admin_servers as _admin_servers
from tidemq.client import producer as _producer
from tidemq.client import pull_consumer as _pull_consumer
from tidemq.client import push_consumer as _push_consumer
from tidemq.client import request_reply as _request_reply
from tidemq.client.admin_consumers import ConsumerRunningInfo
from tidemq.client.consume_service import PushStats
from tidemq.client.listener import ConsumeResult, Listener, MessageModel
from tidemq.client.message import (
    Message,
    MessageQueue,
    PullResult,
    PullStatus,
    SendResult,
    SendStatus,
)
from tidemq.client.pull_consumer import ConsumeFrom
from tidemq.client.route import ClusterInfo, TopicRouteData
from tidemq.protocol.message import MessageExt
from tidemq.remoting.loop import new_event_loop

T = TypeVar("T")

__all__ = [
    "Admin",
    "ConsumeFrom",
    "ConsumeResult",
    "EncodedBatchSender",  # noqa: F822 (provided by __getattr__ below)
    "ExactlyOnceClient",  # noqa: F822 (provided by __getattr__ below)
    "Message",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "PushStats",
    "SendResult",
    "SendStatus",
    "TransactionProducer",  # noqa: F822 (provided by __getattr__ below)
]


def __getattr__(name: str) -> Any:
    # tidemq.client.transaction_sync subclasses this module's Producer, so it is imported on
    # first use rather than at the top (a top or bottom import would be circular).
    if name == "TransactionProducer":
        from tidemq.client.transaction_sync import TransactionProducer

        return TransactionProducer
    if name in ("EncodedBatchSender", "ExactlyOnceClient"):
        from tidemq.client import exactly_once_sync

        return getattr(exactly_once_sync, name)
    raise AttributeError(f"module 'tidemq.sync' has no attribute {name!r}")


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(ready,), name="tidemq-sync-loop", daemon=True
        )
        self.thread.start()
        ready.wait()

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(ready.set)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if threading.current_thread() is self.thread:
            coroutine.close()
            raise RuntimeError(
                "a tidemq.sync call was made on tidemq's own event-loop thread (from a "
                "callback?); it would wait for itself forever — use the asyncio client there"
            )
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future = self.submit(coroutine)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            raise


_loop_thread: _LoopThread | None = None
_loop_thread_lock = threading.Lock()


def _runner() -> _LoopThread:
    global _loop_thread
    runner = _loop_thread
    if runner is None:
        with _loop_thread_lock:
            if _loop_thread is None:
                _loop_thread = _LoopThread()
            runner = _loop_thread
    return runner


def _forget_loop_thread() -> None:
    global _loop_thread
    _loop_thread = None  # the thread does not survive fork; the child starts its own


os.register_at_fork(after_in_child=_forget_loop_thread)


async def _build(factory: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    # Built on the loop's thread so anything that looks for the running loop finds it.
    return factory(*args, **kwargs)


async def _call_plain(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    # Plain (non-async) methods also run on the loop thread: the client is not thread-safe.
    return function(*args, **kwargs)


class _Twin:
    _async: Any

    def __init__(self, factory: Callable[..., Any], *args: Any, **kwargs: Any):
        self._runner = _runner()
        self._async = self._runner.run(_build(factory, *args, **kwargs))

    def _run(self, awaitable: Awaitable[T]) -> T:
        return self._runner.run(awaitable)  # type: ignore[arg-type]

    def _plain(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._runner.run(_call_plain(function, *args, **kwargs))

    def start(self) -> None:
        """Start the client (see the asyncio twin)."""
        self._run(self._async.start())

    def close(self) -> None:
        """Close the client (see the asyncio twin). Idempotent."""
        self._run(self._async.close())

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Producer(_Twin):
    """Synchronous twin of ``tidemq.client.Producer`` (same arguments)."""

    def __init__(self, group: str = "DEFAULT_PRODUCER", namesrv: str | None = None,
                 **options: Any):
        super().__init__(_producer.Producer, group, namesrv, **options)

    @property
    def client_id(self) -> str:
        """The client id, ``<ip>@<instance name>``."""
        return self._async.client_id

    def send(self, message: Message, **options: Any) -> SendResult:
        """Send one message and wait for the broker (``Producer.send``)."""
        return self._run(self._async.send(message, **options))

    def send_async(self, message: Message, **options: Any) -> concurrent.futures.Future:
        """Start sending one message; the future resolves to its SendResult (or error)."""
        return self._runner.submit(self._async.send(message, **options))

    def send_batch(self, messages: Sequence[Message], **options: Any) -> list[SendResult]:
        """Send messages of one topic as batch requests (``Producer.send_batch``)."""
        return self._run(self._async.send_batch(messages, **options))

    def send_oneway(self, message: Message, **options: Any) -> None:
        """Send one message without waiting for an answer (``Producer.send_oneway``)."""
        self._run(self._async.send_oneway(message, **options))

    def request(self, message: Message, timeout_ms: int = 3000, **options: Any) -> MessageExt:
        """Send a request and wait for its reply (``Producer.request``)."""
        return self._run(self._async.request(message, timeout_ms, **options))

    def request_async(self, message: Message, timeout_ms: int = 3000,
                      **options: Any) -> concurrent.futures.Future:
        """Start a request; the future resolves to the reply (or RequestTimeout). Add
        callbacks with ``future.add_done_callback`` (RocketMQ's RequestCallback)."""
        return self._runner.submit(self._async.request(message, timeout_ms, **options))

    def queues(self, topic: str) -> list[MessageQueue]:
        """The publish queues of ``topic``."""
        return self._run(self._async.queues(topic))


class PullConsumer(_Twin):
    """Synchronous twin of ``tidemq.client.PullConsumer`` (same arguments)."""

    def __init__(self, group: str, namesrv: str | None = None, **options: Any):
        super().__init__(_pull_consumer.PullConsumer, group, namesrv, **options)

    @property
    def client_id(self) -> str:
        """The client id, ``<ip>@<instance name>``."""
        return self._async.client_id

    def subscribe(self, topic: str, expression: str | None = "*", *,
                  expression_type: str = "TAG") -> None:
        """Consume ``topic`` sharing its queues with the group (TAG or SQL92 expression)."""
        self._plain(self._async.subscribe, topic, expression, expression_type=expression_type)

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic``."""
        self._plain(self._async.unsubscribe, topic)

    def assign(self, queues: Iterable[MessageQueue], expression: str | None = "*", *,
               expression_type: str = "TAG") -> None:
        """Consume exactly ``queues`` (TAG or SQL92 expression)."""
        self._plain(self._async.assign, list(queues), expression,
                    expression_type=expression_type)

    def assignment(self) -> list[MessageQueue]:
        """The queues currently read."""
        return self._plain(self._async.assignment)

    def subscription(self) -> dict[str, str]:
        """Topic -> tag expression."""
        return self._plain(self._async.subscription)

    def queues(self, topic: str) -> list[MessageQueue]:
        """All readable queues of ``topic``."""
        return self._run(self._async.queues(topic))

    def poll(self, timeout_ms: int = 1000) -> list[MessageExt]:
        """Messages buffered, waiting up to ``timeout_ms`` for the first."""
        return self._run(self._async.poll(timeout_ms))

    def pull(self, queue: MessageQueue, offset: int, max_nums: int = 32,
             **options: Any) -> PullResult:
        """One low-level pull (``PullConsumer.pull``)."""
        return self._run(self._async.pull(queue, offset, max_nums, **options))

    def position(self, queue: MessageQueue) -> int | None:
        """The offset after the last message polled from ``queue``."""
        return self._plain(self._async.position, queue)

    def commit(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """Stage offsets; sent by the next periodic commit or at close."""
        self._plain(self._async.commit, offsets)

    def commit_sync(self, offsets: Mapping[MessageQueue, int] | None = None) -> None:
        """Stage offsets and send every staged offset now."""
        self._run(self._async.commit_sync(offsets))

    def committed(self, queue: MessageQueue) -> int | None:
        """The group's offset for ``queue`` on the broker."""
        return self._run(self._async.committed(queue))

    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Continue ``queue`` at ``offset``."""
        self._run(self._async.seek(queue, offset))

    def seek_to_beginning(self, queue: MessageQueue | None = None) -> None:
        """Seek to the min offset (one queue or all)."""
        self._run(self._async.seek_to_beginning(queue))

    def seek_to_end(self, queue: MessageQueue | None = None) -> None:
        """Seek to the max offset (one queue or all)."""
        self._run(self._async.seek_to_end(queue))

    def seek_to_timestamp(self, queue: MessageQueue | None, timestamp_ms: int) -> None:
        """Seek to the offset stored closest to ``timestamp_ms`` (one queue or all)."""
        self._run(self._async.seek_to_timestamp(queue, timestamp_ms))

    def rebalance(self) -> None:
        """Re-compute the group's queue share now."""
        self._run(self._async.rebalance())


class PushConsumer(_Twin):
    """Synchronous twin of ``tidemq.client.PushConsumer`` (same arguments).

    A plain-function listener runs in a thread pool here (``listener_threads=True`` unless
    given), never on the shared event-loop thread: it may block, and it may call other
    ``tidemq.sync`` clients (send with a sync Producer, for instance). ``start`` returns once
    consumption runs; ``close`` (or ``shutdown``) stops it.
    """

    def __init__(self, group: str, namesrv: str | None = None, **options: Any):
        options.setdefault("listener_threads", True)
        super().__init__(_push_consumer.PushConsumer, group, namesrv, **options)

    @property
    def client_id(self) -> str:
        """The client id, ``<ip>@<instance name>``."""
        return self._async.client_id

    def subscribe(self, topic: str, expression: str | None = "*", *,
                  expression_type: str = "TAG") -> None:
        """Consume ``topic``'s messages matching ``expression`` (TAG or SQL92)."""
        self._plain(self._async.subscribe, topic, expression, expression_type=expression_type)

    def unsubscribe(self, topic: str) -> None:
        """Stop consuming ``topic``."""
        self._plain(self._async.unsubscribe, topic)

    def subscription(self) -> dict[str, str]:
        """Topic -> tag expression."""
        return self._plain(self._async.subscription)

    def listener(self, function: Listener) -> Listener:
        """Register the (concurrent) listener; usable as a decorator."""
        self._plain(self._async.listener, function)
        return function

    def orderly_listener(self, function: Listener) -> Listener:
        """Register an orderly listener; usable as a decorator."""
        self._plain(self._async.orderly_listener, function)
        return function

    def assignment(self) -> list[MessageQueue]:
        """The queues owned now."""
        return self._plain(self._async.assignment)

    def stats(self) -> PushStats:
        """A snapshot of the consumer's counters."""
        return self._plain(self._async.stats)

    def rebalance(self) -> None:
        """Re-share the group's queues now."""
        self._run(self._async.rebalance())

    def consumer_offsets(self, topic: str) -> dict[MessageQueue, int]:
        """This consumer's current offset of each owned queue of ``topic``."""
        return self._plain(self._async.consumer_offsets, topic)

    def reset_offsets(self, offsets: Mapping[MessageQueue, int]) -> None:
        """Move owned queues to ``offsets`` (``PushConsumer.reset_offsets``)."""
        self._run(self._async.reset_offsets(offsets))

    shutdown = _Twin.close


class Admin(_Twin):
    """Synchronous twin of ``tidemq.client.Admin`` (same arguments and methods)."""

    def __init__(self, namesrv: str | None = None, **options: Any):
        super().__init__(_admin.Admin, namesrv, **options)

    def cluster_list(self) -> ClusterInfo:
        """Every cluster and broker group (``Admin.cluster_list``)."""
        return self._run(self._async.cluster_list())

    def broker_runtime_info(self, broker_addr: str) -> dict[str, str]:
        """A broker's statistics table (``Admin.broker_runtime_info``)."""
        return self._run(self._async.broker_runtime_info(broker_addr))

    def create_topic(self, topic: str, queue_nums: int = 8, perm: int = 6,
                     **options: Any) -> list[str]:
        """Create or update a topic (``Admin.create_topic``)."""
        return self._run(self._async.create_topic(topic, queue_nums, perm, **options))

    update_topic = create_topic

    def delete_topic(self, topic: str, **options: Any) -> list[str]:
        """Delete a topic from brokers and name servers (``Admin.delete_topic``)."""
        return self._run(self._async.delete_topic(topic, **options))

    def topic_route(self, topic: str) -> TopicRouteData:
        """A topic's route (``Admin.topic_route``)."""
        return self._run(self._async.topic_route(topic))

    def topic_list(self) -> list[str]:
        """Every topic the name servers know (``Admin.topic_list``)."""
        return self._run(self._async.topic_list())

    def topic_stats(self, topic: str) -> dict[MessageQueue, _admin.TopicOffset]:
        """Min/max offset per queue (``Admin.topic_stats``)."""
        return self._run(self._async.topic_stats(topic))

    def consume_stats(self, group: str, topic: str | None = None) -> _admin.ConsumeStats:
        """A group's progress and lag (``Admin.consume_stats``)."""
        return self._run(self._async.consume_stats(group, topic))

    consumer_progress = consume_stats

    def max_offset(self, queue: MessageQueue) -> int:
        """The next offset of a queue (``Admin.max_offset``)."""
        return self._run(self._async.max_offset(queue))

    def min_offset(self, queue: MessageQueue) -> int:
        """The oldest stored offset of a queue (``Admin.min_offset``)."""
        return self._run(self._async.min_offset(queue))

    def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The offset stored closest to a time (``Admin.search_offset``)."""
        return self._run(self._async.search_offset(queue, timestamp_ms))

    def earliest_msg_store_time(self, queue: MessageQueue) -> int:
        """Store time of a queue's oldest message."""
        return self._run(self._async.earliest_msg_store_time(queue))

    def committed_offset(self, group: str, queue: MessageQueue) -> int | None:
        """A group's committed offset of a queue (``Admin.committed_offset``)."""
        return self._run(self._async.committed_offset(group, queue))

    def reset_offset_by_time(self, group: str, topic: str, timestamp_ms: int, *,
                             force: bool = True) -> dict[MessageQueue, int]:
        """Move a group's offsets to a time (``Admin.reset_offset_by_time``)."""
        return self._run(self._async.reset_offset_by_time(group, topic, timestamp_ms,
                                                          force=force))

    def consumer_running_info(self, group: str, client_id: str, *, jstack: bool = False
                              ) -> ConsumerRunningInfo:
        """What a live consumer reports about itself (``Admin.consumer_running_info``)."""
        return self._run(self._async.consumer_running_info(group, client_id, jstack=jstack))

    def consumer_status(self, group: str, topic: str, client_id: str | None = None
                        ) -> dict[str, dict[MessageQueue, int]]:
        """Each live consumer's own offsets of a topic (``Admin.consumer_status``)."""
        return self._run(self._async.consumer_status(group, topic, client_id))

    def update_subscription_group(self, group: str, **options: Any) -> list[str]:
        """Create or update a consumer group's config."""
        return self._run(self._async.update_subscription_group(group, **options))

    def query_message_by_id(self, msg_id: str, topic: str | None = None) -> MessageExt:
        """A message by offset id or client id (``Admin.query_message_by_id``)."""
        return self._run(self._async.query_message_by_id(msg_id, topic))

    def query_message_by_key(self, topic: str, key: str, **options: Any) -> list[MessageExt]:
        """Messages carrying a key (``Admin.query_message_by_key``)."""
        return self._run(self._async.query_message_by_key(topic, key, **options))

    def query_message_by_offset(self, queue: MessageQueue, offset: int) -> MessageExt:
        """The message at a queue offset."""
        return self._run(self._async.query_message_by_offset(queue, offset))

    def dead_letters(self, group: str, **options: Any) -> list[_admin.DeadLetter]:
        """The messages in ``%DLQ%<group>`` (``Admin.dead_letters``)."""
        return self._run(self._async.dead_letters(group, **options))

    def redrive_dead_letters(self, group: str, **options: Any
                             ) -> list[tuple[_admin.DeadLetter, SendResult]]:
        """Send dead letters back to be consumed again (``Admin.redrive_dead_letters``)."""
        return self._run(self._async.redrive_dead_letters(group, **options))

    def put_kv_config(self, namespace: str, key: str, value: str) -> None:
        """PUT_KV_CONFIG on every name server."""
        self._run(self._async.put_kv_config(namespace, key, value))

    def get_kv_config(self, namespace: str, key: str) -> str | None:
        """GET_KV_CONFIG from a name server."""
        return self._run(self._async.get_kv_config(namespace, key))

    def __getattr__(self, name: str) -> Any:
        """The twins of the server, group and message methods of ``Admin``
        (``broker_config``, ``update_broker_config``, ``consumer_connection``,
        ``clone_group_offset``, ``consume_queue``, ...): each runs the asyncio method and
        returns its result; ``queue_messages`` and ``topic_messages`` return lists."""
        if name.startswith("_") or not any(name in vars(part) for part in _ADMIN_PARTS):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        method = getattr(self._async, name)
        if name in _ADMIN_ITERATORS:
            return lambda *args, **kwargs: self._run(_collect(method(*args, **kwargs)))
        return lambda *args, **kwargs: self._run(method(*args, **kwargs))


def replying(producer: Producer, handler: Callable[[MessageExt], bytes | str]
             ) -> Callable[[list[MessageExt]], ConsumeResult]:
    """A listener for ``tidemq.sync.PushConsumer`` that answers each request with
    ``handler(request)`` sent by the sync ``producer`` (``tidemq.client.replying``'s twin)."""

    def listener(messages: list[MessageExt]) -> ConsumeResult:
        for message in messages:
            body = handler(message)
            if _request_reply.is_request(message):
                producer.send(_request_reply.reply_message(message, body))
        return ConsumeResult.SUCCESS

    return listener


# The Admin mixins whose public methods the sync twin forwards (Admin.__getattr__).
_ADMIN_PARTS = (_admin_servers.ServerAdmin, _admin_groups.GroupAdmin,
                _admin_messages.MessageAdmin)
_ADMIN_ITERATORS = frozenset({"queue_messages", "topic_messages"})


async def _collect(iterator: Any) -> list[Any]:
    return [item async for item in iterator]
