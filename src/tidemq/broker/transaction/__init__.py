"""Transactional messages: half messages, END_TRANSACTION, op records and the check service.

- ``records``: the shapes of half, committed, discarded and op records, and the
  CHECK_TRANSACTION_STATE request (RocketMQ's, byte for byte);
- ``progress``: which halves ended and which wait, and its checkpoint file;
- ``service``: ``TransactionService``, the theory of operation, the check task;
- ``end_processor``: the END_TRANSACTION (37) handler;
- ``settings``: ``TransactionSettings``, the check service's timing;
- ``end_writer``, ``checker``, ``end_processor``: ends written in batches, the check task,
  the END_TRANSACTION (37) handler; each uses the service through a small protocol of its
  own (``EndWriterHost``, ``CheckHost``, ``EndHost``), so none imports the service;
- ``prepared_ranges``: exactly-once halves tracked per prepared batch in the progress;
- ``batches``: ``PreparedBatches``, what the service asks of the exactly-once part, which
  lives above this package (tidemq.broker.exactly_once).

The controller builds one ``TransactionService``, registers it, starts it after the
consumption services (it needs the producer manager) and stops it before the store closes;
the send path hands every single message to ``TransactionService.prepare`` and every
transactional batch to ``ExactlyOnceService.prepare_batch`` / ``prepare_columns``.
"""

from tidemq.broker.transaction.records import Outcome
from tidemq.broker.transaction.service import HalfMessageRef, TransactionService
from tidemq.broker.transaction.settings import TransactionSettings

__all__ = ["HalfMessageRef", "Outcome", "TransactionService", "TransactionSettings"]
