"""Synchronous twin of ``TransactionProducer``, for scripts and threads (like ``tidemq.sync``).

```python
from tidemq.client.transaction_sync import TransactionProducer, TransactionState

def check(message):  # runs in a worker thread: it may block on a database
    return TransactionState.COMMIT if order_exists(message) else TransactionState.ROLLBACK

with TransactionProducer("orders-tx", namesrv="127.0.0.1:9876", check=check) as producer:
    result = producer.send_in_transaction(Message("Orders", b"..."), lambda m: save_order(m))
```

The asyncio producer runs on ``tidemq.sync``'s shared private loop. ``send_in_transaction``
sends the half there, runs ``local_tx`` in the calling thread (so it may use the caller's
database connection and block as long as it needs), then ends the transaction there.
``check`` runs in a worker thread of that loop, so it too may block and call other
synchronous tidemq APIs. Behaviour, arguments and errors are those of the asyncio class
(transaction_producer.py).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Iterable
from typing import Any

from tidemq.client import transaction_producer as _transaction
from tidemq.client.message import Message, SendResult, SendStatus
from tidemq.client.transaction_producer import (
    CheckListener,
    TransactionSendResult,
    TransactionState,
    error_remark,
    local_state,
    transaction_result,
)
from tidemq.errors import ClientError, ProtocolError
from tidemq.protocol.message import MessageExt
from tidemq.remoting.errors import RemotingError
from tidemq.sync import Producer

__all__ = ["TransactionProducer", "TransactionSendResult", "TransactionState"]

log = logging.getLogger("tidemq.client")


def _in_worker_thread(check: CheckListener | None) -> CheckListener | None:
    """``check`` made to run in a worker thread of the loop (coroutine functions as they are)."""
    if check is None or inspect.iscoroutinefunction(check):
        return check

    async def check_in_thread(message: MessageExt) -> TransactionState:
        return local_state(await asyncio.to_thread(check, message))

    return check_in_thread


class TransactionProducer(Producer):
    """Synchronous twin of ``tidemq.client.transaction_producer.TransactionProducer``.

    Args:
        group, namesrv, check_topics, **options: as the asyncio class.
        check: ``check(message) -> TransactionState``; a plain function runs in a worker
            thread, a coroutine function on the loop.
    """

    def __init__(
        self,
        group: str = "DEFAULT_PRODUCER",
        namesrv: str | None = None,
        *,
        check: CheckListener | None = None,
        check_topics: Iterable[str] = (),
        **options: Any,
    ):
        # Producer's own __init__ would build a plain Producer; build ours on the loop.
        super(Producer, self).__init__(
            _transaction.TransactionProducer, group, namesrv,
            check=_in_worker_thread(check), check_topics=tuple(check_topics), **options,
        )

    def send_in_transaction(
        self,
        message: Message,
        local_tx: Any,
        *,
        transaction_id: str | None = None,
        timeout_ms: int | None = None,
    ) -> TransactionSendResult:
        """Send the half, run ``local_tx(message)`` in this thread, end the transaction.

        Same contract as the asyncio ``send_in_transaction``; ``local_tx`` is a plain
        function returning a TransactionState (or None for UNKNOWN).
        """
        result = self.send_half(message, transaction_id=transaction_id, timeout_ms=timeout_ms)
        error: BaseException | None = None
        if result.status is not SendStatus.SEND_OK:
            state = TransactionState.ROLLBACK
        else:
            try:
                state = local_state(local_tx(message))
            except Exception as exc:
                state, error = TransactionState.UNKNOWN, exc
        try:
            self.end_transaction(result, state, remark=error_remark(error))
        except (ClientError, RemotingError, ProtocolError) as exc:
            log.warning(
                "transaction %s ended %s locally, but telling broker %s failed (%s); the "
                "broker's check will settle it", result.transaction_id, state.name,
                result.queue.broker_name, exc,
            )
        if error is not None:
            raise error
        return transaction_result(result, state)

    def send_half(
        self, message: Message, *, transaction_id: str | None = None,
        timeout_ms: int | None = None,
    ) -> SendResult:
        """Send ``message`` as a half message (``TransactionProducer.send_half``)."""
        return self._run(self._async.send_half(message, transaction_id=transaction_id,
                                               timeout_ms=timeout_ms))

    def end_transaction(
        self, result: SendResult, state: TransactionState, *, remark: str | None = None,
        wait: bool = False,
    ) -> None:
        """Commit, roll back or leave open the half of ``result``
        (``TransactionProducer.end_transaction``)."""
        self._run(self._async.end_transaction(result, state, remark=remark, wait=wait))
