"""Transactional messages: half messages, END_TRANSACTION, op records and the check service.

- ``records``: the shapes of half, committed, discarded and op records, and the
  CHECK_TRANSACTION_STATE request (RocketMQ's, byte for byte);
- ``progress``: which halves ended and which wait, and its checkpoint file;
- ``service``: ``TransactionService``, the theory of operation, the check task;
- ``end_processor``: the END_TRANSACTION (37) handler.

The controller builds one ``TransactionService``, registers it, starts it after the
consumption services (it needs the producer manager) and stops it before the store closes;
the send path hands every single message to ``TransactionService.prepare``.
"""

from tidemq.broker.transaction.records import Outcome
from tidemq.broker.transaction.service import (
    HalfMessageRef,
    TransactionService,
    TransactionSettings,
)

__all__ = ["HalfMessageRef", "Outcome", "TransactionService", "TransactionSettings"]
