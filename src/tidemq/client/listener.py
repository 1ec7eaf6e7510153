"""Message listeners of the push consumer: what they return and how they are called.

A listener gets a list of messages (at most ``consume_message_batch_max_size``, 1 by default)
and says how consuming them went:

- ``ConsumeResult.SUCCESS`` (or ``None``: returning nothing means it went well): the
  messages are done, their offsets may be committed;
- ``ConsumeResult.RECONSUME_LATER`` (``SUSPEND_CURRENT_QUEUE_A_MOMENT`` is the same value,
  RocketMQ's orderly name), or any exception raised: the messages failed. A concurrent
  consumer sends them back to the broker for a later retry; an orderly consumer waits a
  moment and gives the same messages to the listener again.

A listener is a plain function or a coroutine function (``async def``); a plain function
that returns an awaitable is awaited too. Plain functions run on the event loop itself by
default, which is the fastest way (no thread hop per batch) but means the function must not
block; with ``listener_threads`` they run in a thread pool instead (the synchronous
``tidemq.sync.PushConsumer`` does that by default, so a listener may call other
``tidemq.sync`` clients).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tidemq.protocol.message import MessageExt

log = logging.getLogger("tidemq.client")


class ConsumeResult(enum.Enum):
    """What a listener answers for a batch of messages."""

    SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"
    # RocketMQ's orderly listeners say this; it means the same here (an alias).
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "RECONSUME_LATER"


class MessageModel(enum.Enum):
    """How a group's members share messages (RocketMQ MessageModel)."""

    CLUSTERING = "CLUSTERING"  # each message to one member of the group
    BROADCASTING = "BROADCASTING"  # each message to every member

    @classmethod
    def parse(cls, value: MessageModel | str) -> MessageModel:
        """Accept a member or its name, any case.

        Raises:
            ValueError: anything else, naming the accepted values.
        """
        if isinstance(value, MessageModel):
            return value
        text = str(value).strip().upper()
        for member in cls:
            if text == member.value:
                return member
        raise ValueError(f"message_model={value!r}: expected CLUSTERING or BROADCASTING")


ListenerResult = ConsumeResult | None
Listener = Callable[[list[MessageExt]], ListenerResult | Awaitable[ListenerResult]]


def is_coroutine_listener(function: Callable[..., Any]) -> bool:
    """True for ``async def`` functions and objects whose ``__call__`` is one."""
    if inspect.iscoroutinefunction(function):
        return True
    if inspect.isroutine(function):
        return False
    return inspect.iscoroutinefunction(inspect.getattr_static(type(function), "__call__", None))


def as_result(value: object, where: str) -> ConsumeResult:
    """Turn a listener's return value into a ConsumeResult (None -> SUCCESS).

    Anything else than None or a ConsumeResult counts as a failure, with a warning naming
    what was returned, so a listener returning e.g. ``False`` is not mistaken for success.
    """
    if value is None or value is ConsumeResult.SUCCESS:
        return ConsumeResult.SUCCESS
    if isinstance(value, ConsumeResult):
        return value
    log.warning("listener of %s returned %r; return ConsumeResult.SUCCESS or "
                "RECONSUME_LATER (None counts as SUCCESS); treating it as RECONSUME_LATER",
                where, value)
    return ConsumeResult.RECONSUME_LATER


class ListenerInvoker:
    """Calls one listener the way it asked to be called.

    Args:
        function: the listener.
        executor: a thread pool for plain functions, or None to call them on the loop.
        where: names the consumer in log lines (its group).

    Attributes:
        inline: True when calls finish without suspending the event loop (a plain function
            called on the loop): the consume service then calls ``call_inline`` directly.
    """

    def __init__(self, function: Listener,
                 executor: concurrent.futures.Executor | None, where: str) -> None:
        self.function = function
        self.executor = executor
        self.where = where
        self.coroutine = is_coroutine_listener(function)
        self.inline = not self.coroutine and executor is None

    def call_inline(self, messages: list[MessageExt]) -> ConsumeResult | Awaitable[Any]:
        """Call a plain listener on the loop; returns its result, or an awaitable it returned
        (pass that to ``finish``). An exception is logged and counts as RECONSUME_LATER."""
        try:
            value = self.function(messages)
        except Exception:
            self._log_failure(messages)
            return ConsumeResult.RECONSUME_LATER
        if value is None or value is ConsumeResult.SUCCESS:
            return ConsumeResult.SUCCESS
        if inspect.isawaitable(value):
            return value
        return as_result(value, self.where)

    async def finish(self, awaitable: Awaitable[Any], messages: list[MessageExt]
                     ) -> ConsumeResult:
        """Await what a listener returned and turn it into a ConsumeResult."""
        try:
            value = await awaitable
        except asyncio.CancelledError:
            raise
        except Exception:
            self._log_failure(messages)
            return ConsumeResult.RECONSUME_LATER
        return as_result(value, self.where)

    async def call(self, messages: list[MessageExt]) -> ConsumeResult:
        """Call the listener, whatever its kind, and return its ConsumeResult."""
        if self.coroutine:
            try:
                awaitable = self.function(messages)
            except Exception:
                self._log_failure(messages)
                return ConsumeResult.RECONSUME_LATER
            return await self.finish(awaitable, messages)  # type: ignore[arg-type]
        if self.executor is None:
            outcome = self.call_inline(messages)
            if isinstance(outcome, ConsumeResult):
                return outcome
            return await self.finish(outcome, messages)
        loop = asyncio.get_running_loop()
        try:
            value = await loop.run_in_executor(self.executor, self.function, messages)
        except asyncio.CancelledError:
            raise
        except Exception:
            self._log_failure(messages)
            return ConsumeResult.RECONSUME_LATER
        if inspect.isawaitable(value):
            return await self.finish(value, messages)
        return as_result(value, self.where)

    def _log_failure(self, messages: list[MessageExt]) -> None:
        ids = ", ".join(m.msg_id for m in messages[:5]) + (" ..." if len(messages) > 5 else "")
        log.warning("listener of %s raised while consuming %d message(s) [%s]; they will be "
                    "consumed again later", self.where, len(messages), ids, exc_info=True)
