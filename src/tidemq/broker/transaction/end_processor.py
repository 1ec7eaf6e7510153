"""END_TRANSACTION (37): a producer commits or rolls back a half message (docs/protocol.md §4.9).

Producers send it oneway, both after their local transaction and when answering the broker's
CHECK_TRANSACTION_STATE (``fromTransactionCheck=true``), so the response is only seen by a
client that asked for one; it says what happened all the same:

- a slave: SLAVE_NOT_AVAILABLE (its master keeps the transactions);
- a missing or unparsable header field: SYSTEM_ERROR naming the field;
- commitOrRollback 0 ("still unknown"): no response, as RocketMQ; the half stays pending
  and the check service asks again later;
- otherwise the service's answer (service.py ``end_transaction``): SUCCESS, or
  SYSTEM_ERROR / MESSAGE_ILLEGAL / SERVICE_NOT_AVAILABLE with a remark naming the half.

A remark the producer sent (the Java client puts its local transaction's exception there)
is logged with the outcome.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from tidemq.errors import HeaderFieldError
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import EndTransactionRequestHeader

if TYPE_CHECKING:
    from tidemq.broker.transaction.end_writer import EndAnswer
    from tidemq.protocol.headers import EndTransactionRequestHeader
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer

log = logging.getLogger("tidemq.broker")

_KIND_WORDS = {0: "unknown", 8: "commit", 12: "rollback"}


class EndHost(Protocol):
    """What END_TRANSACTION's handler uses of the transaction service."""

    @property
    def is_slave(self) -> bool:
        """True on a slave broker (END_TRANSACTION is refused)."""
        ...

    async def ready(self) -> None:
        """Wait until the transaction progress is restored."""
        ...

    async def end_transaction(
        self, header: EndTransactionRequestHeader, *, answer_wanted: bool = True
    ) -> EndAnswer | None:
        """Commit or roll back the half the header names."""
        ...


class EndTransactionProcessor:
    """Serves END_TRANSACTION for one broker's transaction service."""

    def __init__(self, service: EndHost) -> None:
        self._service = service

    def register(self, server: RemotingServer) -> None:
        """Register the handlers on ``server``."""
        server.register(RequestCode.END_TRANSACTION, self.handle, group_handler=self.handle_group)

    async def handle_group(
        self, requests: list[RemotingCommand], connection: Connection
    ) -> list[RemotingCommand | None]:
        """Answer END_TRANSACTIONs that arrived in one read, each as ``handle`` would.

        They are decided one after the other in this one call, without a task each, so
        their commits share one end-writer flush (one group put of the committed messages,
        one op record). A request that waits for its answer is awaited with the others at
        the end; a oneway one never waits for the write.
        """
        responses: list[RemotingCommand | None] = [None] * len(requests)
        waiting: list[tuple[int, asyncio.Task[RemotingCommand | None]]] = []
        loop = asyncio.get_running_loop()
        for index, request in enumerate(requests):
            if request.is_oneway:
                responses[index] = await self.handle(request, connection)
            else:
                waiting.append((index, loop.create_task(self.handle(request, connection))))
        for index, task in waiting:
            responses[index] = await task
        return responses

    async def handle(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand | None:
        """Answer one END_TRANSACTION (None: no response, see the module docstring)."""
        service = self._service
        if service.is_slave:
            return RemotingCommand.response_to(
                request,
                ResponseCode.SLAVE_NOT_AVAILABLE,
                "this broker is a slave (brokerRole=SLAVE) and keeps no transactions; end "
                "the transaction at its master",
            )
        try:
            header = EndTransactionRequestHeader.from_ext_fields(request.ext_fields)
        except HeaderFieldError as exc:
            return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, str(exc))
        await service.ready()
        answer = await service.end_transaction(header, answer_wanted=not request.is_oneway)
        _log_end(header, request.remark, connection, answer)
        if answer is None:
            return None
        return RemotingCommand.response_to(request, answer.code, answer.remark)


def _log_end(
    header: EndTransactionRequestHeader, remark: str | None, connection: Connection,
    answer: object,
) -> None:
    # Commits are the common case; rollbacks, unknowns and remarks tell of trouble.
    quiet = header.commit_or_rollback == 8 and not remark
    level = logging.DEBUG if quiet else logging.INFO
    if not log.isEnabledFor(level):
        return
    kind = _KIND_WORDS.get(header.commit_or_rollback, str(header.commit_or_rollback))
    source = "answering a check" if header.from_transaction_check else "after its transaction"
    log.log(
        level,
        "producer %s of group %s ended half offset %d with %s %s%s: %s",
        connection.remote_address, header.producer_group, header.tran_state_table_offset,
        kind, source, f" (remark: {remark})" if remark else "", answer,
    )
