"""Transactional messages: half messages, END_TRANSACTION, op records and the check service.

- ``records``: the shapes of half, committed, discarded and op records, and the
  CHECK_TRANSACTION_STATE request (RocketMQ's, byte for byte);
- ``progress``: which halves ended and which wait, and its checkpoint file;
- ``service``: ``TransactionService``, the theory of operation, the check task;
- ``end_processor``: the END_TRANSACTION (37) handler;
- ``exactly_once``, ``eos_decisions``, ``eos_processor``: batches of halves committed once per
  (query id, batch id) for the exactly-once Spark sink, the durable table of those decisions,
  and the EOS_COMMIT_BATCH / EOS_ABORT_BATCH (tidemq's 30001 / 30002) handler;
- ``eos_records``: the EOS_* properties of a half and the message its commit stores;
- ``prepared_ranges``, ``range_ends``: exactly-once halves tracked per prepared batch, and
  such a batch committed (one read, column by column) or rolled back as a whole.

The controller builds one ``TransactionService``, registers it, starts it after the
consumption services (it needs the producer manager) and stops it before the store closes;
the send path hands every single message to ``TransactionService.prepare`` and every
transactional batch to ``TransactionService.prepare_batch``.
"""

from tidemq.broker.transaction.records import Outcome
from tidemq.broker.transaction.service import (
    HalfMessageRef,
    TransactionService,
    TransactionSettings,
)

__all__ = ["HalfMessageRef", "Outcome", "TransactionService", "TransactionSettings"]
