"""EOS_COMMIT_BATCH (30001) and EOS_ABORT_BATCH (30002): tidemq's exactly-once batch requests.

The driver of an exactly-once Spark sink sends one of each per broker and micro-batch
(service.py has the header, the body and what the broker does). Answers:

- a slave: SLAVE_NOT_AVAILABLE (its master keeps the transactions);
- a malformed header or body: SYSTEM_ERROR naming the field;
- otherwise the service's answer: SUCCESS with ``committedCount``, ``alreadyCommitted`` and
  ``rolledBackCount``, or EOS_BATCH_INCOMPLETE / SYSTEM_ERROR with a remark.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from tidemq.broker.exactly_once.service import (
    EosRequestError,
    ExactlyOnceService,
    answer_for_bad_request,
    parse_batch_request,
)
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

if TYPE_CHECKING:
    from tidemq.broker.role import ReplicationRole
    from tidemq.remoting.connection import Connection
    from tidemq.remoting.server import RemotingServer


class ExactlyOnceProcessor:
    """Serves the two exactly-once requests for one broker.

    Args:
        eos: the broker's exactly-once part.
        role: a slave refuses both requests.
        ready: waits until the transaction progress is restored (TransactionService.ready).
    """

    def __init__(
        self,
        *,
        eos: ExactlyOnceService,
        role: ReplicationRole,
        ready: Callable[[], Awaitable[None]],
    ) -> None:
        self._eos = eos
        self._role = role
        self._ready = ready

    def register(self, server: RemotingServer) -> None:
        """Register the handlers on ``server``."""
        server.register(RequestCode.EOS_COMMIT_BATCH, self.handle)
        server.register(RequestCode.EOS_ABORT_BATCH, self.handle)

    async def handle(self, request: RemotingCommand, connection: Connection) -> RemotingCommand:
        """Answer one commit or abort."""
        if self._role.is_slave:
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
            await self._ready()
            if request.code == RequestCode.EOS_COMMIT_BATCH:
                answer = await self._eos.commit(batch)
            else:
                answer = await self._eos.abort(batch)
        return RemotingCommand.response_to(request, answer.code, answer.remark,
                                           answer.ext_fields())
