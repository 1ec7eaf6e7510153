"""HalfLedger: the narrow interface exactly-once batches use of the transaction service.

Exactly-once batches are transaction halves: stored, tracked and ended by the transaction
service (tidemq.broker.transaction). The exactly-once part needs only this much of it —
the store, the progress (which halves ended, the prepared ranges), the end writer, the
timing and a few rules — and is written against this protocol, not against
``TransactionService``, which implements it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tidemq.broker.transaction.end_writer import EndWriter
    from tidemq.broker.transaction.progress import TransactionProgress
    from tidemq.broker.transaction.settings import TransactionSettings
    from tidemq.protocol.message import MessageExt
    from tidemq.store.interface import MessageStore


class HalfLedger(Protocol):
    """What the exactly-once part reads and calls on the transaction service."""

    store: MessageStore
    progress: TransactionProgress
    writer: EndWriter
    settings: TransactionSettings
    clock_ms: Callable[[], int]

    def ensure_topic(self, topic: str) -> None:
        """Give a transaction system topic a config on first use."""
        ...

    def immunity_ms(self, properties: dict[str, str]) -> int:
        """How long after its store time a half with these properties is first due."""
        ...

    def stored_before_start(self, half_offset: int) -> bool:
        """True for a half stored before this broker started."""
        ...

    def committed_before_restart(self, half: MessageExt) -> bool:
        """True when a half stored before this start already has a committed copy."""
        ...
