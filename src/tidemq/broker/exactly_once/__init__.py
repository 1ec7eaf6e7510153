"""Exactly-once batches: halves committed once per (query id, batch id), for the Spark sink.

- ``service``: ``ExactlyOnceService``, the theory of operation, the wire format;
- ``ledger``: ``HalfLedger``, the narrow interface to the transaction service it is built on
  (store, progress, end writer, timing; ``TransactionService`` implements it);
- ``decisions``: the durable table of batch decisions (eosCommits.json);
- ``records``: the EOS_* properties of a half and the message its commit stores;
- ``range_ends``: a prepared range committed (one read, column by column) or rolled back as
  a whole;
- ``processor``: the EOS_COMMIT_BATCH / EOS_ABORT_BATCH (tidemq's 30001 / 30002) handler.

This package sits above tidemq.broker.transaction: it imports the transaction package's
records, progress and end writer, never its service; the transaction service calls it back
through ``transaction.batches.PreparedBatches``. The controller builds the service with
``batches=`` a factory of ``ExactlyOnceService`` and hands the send path the same object.
"""
