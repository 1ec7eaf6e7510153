"""ReplicationRole: this broker's part in its master/slave group, asked by every write path.

RocketMQ's broker group is one master (brokerId 0) and slaves (brokerId > 0) under one
brokerName. The role is fixed by the config (brokerRole) for the life of the process; what
changes is what the broker learns about its group: a slave learns its master's address
from the name server's REGISTER_BROKER answer (``learn_master``), and the HA service (the
replication stream, broker/ha/) is attached when one runs.

Every processor that writes (sends, send-backs, END_TRANSACTION, topic and group updates)
asks ``write_refusal`` instead of reading brokerRole itself, so the rule and its remark live
in one place.

Ownership: the broker's event loop; nothing here blocks.
"""

from __future__ import annotations

from tidemq.broker.config import BrokerConfig, BrokerRole
from tidemq.broker.ha.replication import Replication, answered_status
from tidemq.broker.identity import BrokerIdentity
from tidemq.store.interface import PutResult, PutStatus

MASTER_ID = 0  # RocketMQ's MixAll.MASTER_ID


class ReplicationRole:
    """Master or slave, whether writes are taken, and what is known of the master.

    Args:
        config: brokerRole and brokerId.
        identity: this broker's names and address (for remarks).
        replication: the HA side (broker/ha/replication.py): the HAService on a master, the
            HAClient on a slave; None for a broker built without it (unit tests).
        sync_flush_timeout_ms: how long a waiting send waits for the disk (and a slave).
    """

    def __init__(self, config: BrokerConfig, identity: BrokerIdentity,
                 replication: Replication | None = None,
                 sync_flush_timeout_ms: int = 5000) -> None:
        self.role: BrokerRole = config.broker_role
        self._identity = identity
        self.replication = replication
        self._sync_flush_timeout_s = sync_flush_timeout_ms / 1000
        # Learned from the name server's REGISTER_BROKER answer (masterAddr / haServerAddr);
        # None until then, and always None on a master.
        self.master_address: str | None = None
        self.master_ha_address: str | None = None

    @property
    def broker_id(self) -> int:
        """0 on a master, the configured brokerId on a slave."""
        return self._identity.broker_id

    @property
    def is_master(self) -> bool:
        """True for SYNC_MASTER and ASYNC_MASTER."""
        return self.role is not BrokerRole.SLAVE

    @property
    def is_slave(self) -> bool:
        """True for brokerRole=SLAVE: a read-only copy of its master."""
        return self.role is BrokerRole.SLAVE

    @property
    def is_sync_master(self) -> bool:
        """True for SYNC_MASTER: a send waits for a slave to hold the message."""
        return self.role is BrokerRole.SYNC_MASTER

    @property
    def accepts_writes(self) -> bool:
        """False on a slave: messages, offsets of transactions and topics come from the master."""
        return not self.is_slave

    def write_refusal(self, what: str) -> str | None:
        """The remark refusing ``what`` (e.g. "sends to topic T") on a slave; None on a master."""
        if self.accepts_writes:
            return None
        identity = self._identity
        master = f" at {self.master_address}" if self.master_address else ""
        return (
            f"broker {identity.broker_name} at {identity.address} is a slave "
            f"(brokerRole=SLAVE, brokerId={identity.broker_id}) and takes no {what}; "
            f"send them to its master{master}"
        )

    def learn_master(self, master_address: str | None, master_ha_address: str | None) -> None:
        """Record the master's addresses from a name server's answer (slaves only)."""
        if self.is_slave:
            self.master_address = master_address or None
            self.master_ha_address = master_ha_address or None
            if self.replication is not None:
                self.replication.learn_master(self.master_address, self.master_ha_address)

    async def stored_status(self, result: PutResult, wait: bool) -> PutStatus:
        """The status a send is answered with: its put's, then, when its producer waits, the
        disk's under SYNC_FLUSH and a slave's on a SYNC_MASTER (FLUSH_DISK_TIMEOUT,
        FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE all mean "stored")."""
        return await answered_status(result, wait, self._sync_flush_timeout_s, self.replication)

    def runtime_info(self) -> dict[str, str]:
        """The role and replication keys of GET_BROKER_RUNTIME_INFO."""
        if self.replication is None:
            return {"brokerRole": self.role.value}
        return self.replication.runtime_info()
