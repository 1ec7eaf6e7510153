"""EOS_COMMIT_BATCH (30001) and EOS_ABORT_BATCH (30002): tidemq's exactly-once batch requests.

The driver of an exactly-once Spark sink sends one of each per broker and micro-batch
(exactly_once.py has the header, the body and what the broker does). Answers:

- a slave: SLAVE_NOT_AVAILABLE (its master keeps the transactions);
- a malformed header or body: SYSTEM_ERROR naming the field;
- otherwise the service's answer: SUCCESS with ``committedCount``, ``alreadyCommitted`` and
  ``rolledBackCount``, or EOS_BATCH_INCOMPLETE / SYSTEM_ERROR with a remark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidemq.broker.transaction.exactly_once import (
    EosRequestError,
    ExactlyOnceService,
    answer_for_bad_request,
    parse_batch_request,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

if TYPE_CHECKING:
    from tidemq.broker.transaction.service import TransactionService
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer


class ExactlyOnceProcessor:
    """Serves the two exactly-once requests for one broker's TransactionService."""

    def __init__(self, service: TransactionService, eos: ExactlyOnceService) -> None:
        self._service = service
        self._eos = eos

    def register(self, server: RemotingServer) -> None:
        """Register the handlers on ``server``."""
        server.register(RequestCode.EOS_COMMIT_BATCH, self.handle)
        server.register(RequestCode.EOS_ABORT_BATCH, self.handle)

    async def handle(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        """Answer one commit or abort."""
        service = self._service
        if service.is_slave:
            return RemotingCommand.response_to(
                request, ResponseCode.SLAVE_NOT_AVAILABLE,
                "this broker is a slave (brokerRole=SLAVE) and keeps no transactions; commit "
                "the exactly-once batch at its master",
            )
        try:
            batch = parse_batch_request(request.ext_fields, request.body)
        except EosRequestError as exc:
            answer = answer_for_bad_request(exc)
        else:
            await service.ready()
            if request.code == RequestCode.EOS_COMMIT_BATCH:
                answer = await self._eos.commit(batch)
            else:
                answer = await self._eos.abort(batch)
        return RemotingCommand.response_to(request, answer.code, answer.remark,
                                           answer.ext_fields())
