"""Master/slave replication (RocketMQ 4.x HA): the master's HAService streams its commit log
to slaves, the slave's HAClient writes it at the same offsets, and SYNC_MASTER sends wait for
a slave's acknowledgement.

- ``wire.py``: the two byte formats of the stream (offset reports, chunks), sans-IO;
- ``master.py``: HAService (accept slaves, stream, heartbeats, housekeeping, in-sync state);
- ``transfer_waits.py``: SYNC_MASTER's group-committed waits for an acknowledgement;
- ``slave.py``: HAClient (connect, check, copy, report);
- ``master_check.py``: what a slave asks its master before copying (names, offsets, the
  last record), since the stream itself has no handshake.

The store's half is ``tidemq.store.replication``.
"""

from tidemq.broker.ha.master import HAService, HASettings
from tidemq.broker.ha.master_check import MasterCheck
from tidemq.broker.ha.slave import HAClient

__all__ = ["HAClient", "HAService", "HASettings", "MasterCheck"]
