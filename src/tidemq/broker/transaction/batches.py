"""PreparedBatches: what the transaction service asks of the exactly-once part.

The transaction service tracks prepared exactly-once ranges in its progress (they are halves
like any other), but what a range's halves mean — which batch they belong to, whether that
batch was decided — is known only to the exactly-once part (tidemq.broker.exactly_once),
which sits above this package. The service and its check task reach it through this
protocol only; ``ExactlyOnceService`` implements it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tidemq.broker.transaction.progress import PendingHalf
    from tidemq.protocol.message import MessageExt


class PreparedBatches(Protocol):
    """The exactly-once part, as the transaction service and its check task use it."""

    def identity(self, half: MessageExt) -> tuple[str, str, str] | None:
        """``(query id, batch id text, writer id)`` of an exactly-once half, else None."""
        ...

    def settle_due(self, pending: PendingHalf, half: MessageExt, now_ms: int) -> bool:
        """End a due exactly-once half by its batch's decision; False when it is not one."""
        ...

    def settle_due_ranges(self, now_ms: int) -> bool:
        """End the prepared ranges whose timeout came; True when due ones are left over."""
        ...

    async def finish_decided(self) -> None:
        """Commit what decisions written before a crash left uncommitted (at start)."""
        ...

    async def write_decisions(self) -> None:
        """Write the decisions table if it changed (with the progress checkpoint)."""
        ...
