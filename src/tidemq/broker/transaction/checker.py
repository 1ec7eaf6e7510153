"""The check task: find halves nobody ended, ask their producers, discard the unanswered.

Steps 1-3 of the theory of operation in service.py, run by one asyncio task on the broker's
loop (``run``), a round at least every TICK_INTERVAL_MAX_MS:

1. ``scan``: read the half queue on from the scan offset and make old unended halves pending;
   it jumps over open prepared exactly-once ranges (prepared_ranges.py) without reading;
2. ``run_checks``: send CHECK_TRANSACTION_STATE for each pending half whose time has come,
   or discard it after its last check. An exactly-once half (exactly_once.py) is not
   checked: its batch's decision commits it, or it is rolled back; whole prepared ranges
   whose timeout came are settled the same way (``ExactlyOnceService.settle_due_ranges``).

Ownership: the broker's event loop; store calls are quick mmap work done there.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from tidemq.broker.transaction.end_writer import STORED
from tidemq.broker.transaction.progress import PendingHalf
from tidemq.broker.transaction.records import (
    DISCARD_TOPIC,
    HALF_QUEUE_ID,
    HALF_TOPIC,
    NotAHalfMessage,
    Outcome,
    check_request,
    discarded_message,
)
from tidemq.errors import ProtocolError, RemoteProtocolError
from tidemq.protocol.message import PROPERTY_REAL_TOPIC, MessageExt, decode_record
from tidemq.remoting.errors import RemotingError
from tidemq.store.interface import GetStatus, PutStatus

if TYPE_CHECKING:
    from tidemq.broker.client_manager import ClientChannel
    from tidemq.broker.transaction.batches import PreparedBatches
    from tidemq.broker.transaction.end_writer import EndWriter
    from tidemq.broker.transaction.progress import TransactionProgress
    from tidemq.broker.transaction.settings import TransactionSettings
    from tidemq.store.interface import MessageStore

log = logging.getLogger("tidemq.broker")

# A half is looked at once it is this old: nearly every half ends well within it, so a
# steady stream of transactions costs no reads (and transactionTimeOut is rarely below it).
SCAN_AGE_MIN_MS = 1_000
# The check task's longest sleep; it bounds how late a scan or check can run.
TICK_INTERVAL_MAX_MS = 1_000
# Shortest sleep between rounds, so a burst of near-due checks cannot spin.
TICK_INTERVAL_MIN_MS = 50
# Work per round before yielding to the loop (sends and pulls go on meanwhile).
SCAN_READS_PER_TICK_MAX = 1_024
CHECKS_PER_TICK_MAX = 512
# A oneway check waits at most this long for room in a slow producer's write buffer.
CHECK_SEND_TIMEOUT_MS = 3_000
READ_BYTES_MAX = 1024 * 1024 + 64 * 1024  # one half: the largest body and its headers


class CheckHost(Protocol):
    """What the check task uses of the transaction service."""

    store: MessageStore
    progress: TransactionProgress
    writer: EndWriter
    settings: TransactionSettings
    batches: PreparedBatches
    clock_ms: Callable[[], int]

    def stored_before_start(self, half_offset: int) -> bool:
        """True for a half stored before this broker started."""
        ...

    def committed_before_restart(self, half: MessageExt) -> bool:
        """True when a half stored before this start already has a committed copy."""
        ...

    def track(self, half: MessageExt, check_times: int = 0) -> None:
        """Make ``half`` pending."""
        ...

    def live_producers(self, group: str) -> list[ClientChannel]:
        """The connected producers of ``group``."""
        ...

    def end_missing(self, pending: PendingHalf) -> None:
        """End a pending half whose record is gone as DISCARD."""
        ...

    def ensure_topic(self, topic: str) -> None:
        """Give a transaction system topic a config on first use."""
        ...


class TransactionChecker:
    """The scan and check rounds of one broker's transaction service."""

    def __init__(self, service: CheckHost) -> None:
        self._service = service

    async def run(self) -> None:
        """Run rounds until cancelled; a failing round is logged and retried."""
        while True:
            try:
                wait_ms = await self.tick()
            except Exception:
                log.exception("transaction check round failed; retrying in %d ms",
                              TICK_INTERVAL_MAX_MS)
                wait_ms = TICK_INTERVAL_MAX_MS
            await asyncio.sleep(wait_ms / 1000)

    async def tick(self) -> int:
        """One round of scan and checks; returns how long to sleep before the next (ms)."""
        now_ms = self._service.clock_ms()
        more = self.scan(now_ms)
        more = await self.run_checks(now_ms) or more
        if more:
            return 0
        progress = self._service.progress
        dues = [due for due in (progress.next_due_ms(), progress.prepared.next_due_ms())
                if due is not None]
        if not dues:
            return TICK_INTERVAL_MAX_MS
        next_due = min(dues)
        return max(TICK_INTERVAL_MIN_MS, min(next_due - now_ms, TICK_INTERVAL_MAX_MS))

    # -- 1. scan ---------------------------------------------------------------------------

    def scan(self, now_ms: int) -> bool:
        """Move the scan offset over the half queue (step 1).

        Returns:
            True when work is left for the next round (the read budget ran out).
        """
        service = self._service
        store = service.store
        progress = service.progress
        ended = progress.ended
        prepared = progress.prepared
        end = store.max_offset(HALF_TOPIC, HALF_QUEUE_ID)
        offset = progress.scan_offset
        reads = 0
        try:
            while offset < end:
                if offset in ended:
                    offset += 1
                    continue
                if prepared:
                    open_range = prepared.find(offset)
                    if open_range is not None:  # settled as a whole, by its batch or timeout
                        offset = open_range.end
                        continue
                if reads >= SCAN_READS_PER_TICK_MAX:
                    return True
                reads += 1
                result = store.get_messages(HALF_TOPIC, HALF_QUEUE_ID, offset, 1, READ_BYTES_MAX)
                if result.status is not GetStatus.FOUND:
                    if result.next_begin_offset > offset:
                        log.warning("half queue offset %d is unreadable (%s); continuing at %d",
                                    offset, result.status.value, result.next_begin_offset)
                        offset = result.next_begin_offset
                        continue
                    return False
                try:
                    half = decode_record(result.body)
                except RemoteProtocolError as exc:
                    log.error("half queue offset %d does not decode (%s); skipped", offset, exc)
                    offset += 1
                    continue
                restored = service.stored_before_start(offset)
                if not restored and now_ms - half.store_timestamp < SCAN_AGE_MIN_MS:
                    return False
                if restored and service.committed_before_restart(half):
                    service.writer.end_now(half, Outcome.COMMIT)
                else:
                    service.track(half)
                offset += 1
            return False
        finally:
            progress.scan_offset = offset

    # -- 2. check or discard -----------------------------------------------------------------

    async def run_checks(self, now_ms: int) -> bool:
        """Check or discard every pending half due at ``now_ms`` (steps 2 and 3).

        Returns:
            True when due halves are left for the next round (the budget ran out).
        """
        service = self._service
        progress = service.progress
        settings = service.settings
        unreachable: collections.Counter[str] = collections.Counter()
        if service.batches.settle_due_ranges(now_ms):
            return True
        try:
            for _ in range(CHECKS_PER_TICK_MAX):
                pending = progress.pop_due(now_ms)
                if pending is None:
                    return False
                half = self._stored_half(pending)
                if half is None:
                    continue
                if service.batches.settle_due(pending, half, now_ms):
                    continue  # an exactly-once half: ended by its batch's decision
                if pending.check_times >= settings.check_max:
                    self._discard(pending, now_ms, half)
                    continue
                pending.check_times += 1
                progress.reschedule(pending, now_ms + settings.check_interval_ms)
                if not await self._send_check(pending, half):
                    unreachable[pending.producer_group] += 1
            return True
        finally:
            for group, count in unreachable.items():  # one line per group, not per half
                log.warning(
                    "no producer of group %s is connected: %d half message(s) due for a check "
                    "were not asked about (counted as checks; transactionCheckMax=%d)",
                    group, count, settings.check_max,
                )

    async def _send_check(self, pending: PendingHalf, half: MessageExt) -> bool:
        """Ask a producer of the half's group; False when none is connected."""
        try:
            request = check_request(half)
        except NotAHalfMessage as exc:
            log.error("half offset %d cannot be checked: %s; it ends unanswered",
                      pending.queue_offset, exc)
            self._service.writer.end_now(half, Outcome.DISCARD)
            return True
        service = self._service
        channels = service.live_producers(pending.producer_group)
        if not channels:
            return False
        # Successive checks of one half go to successive producers of the group.
        channel = channels[pending.check_times % len(channels)]
        try:
            await channel.connection.send_oneway(request, CHECK_SEND_TIMEOUT_MS)
        except (RemotingError, ProtocolError) as exc:
            log.warning("check of half offset %d to producer %s failed: %s",
                        pending.queue_offset, channel.client_id, exc)
            return True
        log.debug("checked half offset %d (transaction %s) with producer %s, check %d of %d",
                  pending.queue_offset, pending.transaction_id, channel.client_id,
                  pending.check_times, service.settings.check_max)
        return True

    def _stored_half(self, pending: PendingHalf) -> MessageExt | None:
        """The half's record; a half no longer stored (retention) ends as DISCARD -> None."""
        service = self._service
        record = service.store.read_message(pending.physical_offset)
        try:
            half = decode_record(record) if record is not None else None
        except RemoteProtocolError:
            half = None
        if half is None or half.topic != HALF_TOPIC:
            log.warning("half offset %d (producer group %s) is no longer stored; it ends "
                        "unanswered", pending.queue_offset, pending.producer_group)
            service.end_missing(pending)
            return None
        return half

    def _discard(self, pending: PendingHalf, now_ms: int, half: MessageExt) -> None:
        service = self._service
        if service.committed_before_restart(half):
            service.writer.end_now(half, Outcome.COMMIT)
            return
        service.ensure_topic(DISCARD_TOPIC)
        result = service.store.put_message(discarded_message(half))
        if result.status not in STORED and result.status is not PutStatus.MESSAGE_ILLEGAL:
            log.warning("half offset %d could not be copied to %s (%s); trying again in %d ms",
                        pending.queue_offset, DISCARD_TOPIC, result.status.value,
                        service.settings.check_interval_ms)
            service.progress.reschedule(pending, now_ms + service.settings.check_interval_ms)
            return
        log.warning(
            "half message at offset %d of producer group %s (transaction %s, topic %s) got no "
            "answer to %d checks (transactionCheckMax); discarded to %s",
            pending.queue_offset, pending.producer_group, pending.transaction_id,
            half.properties.get(PROPERTY_REAL_TOPIC), pending.check_times, DISCARD_TOPIC,
        )
        service.writer.end_now(half, Outcome.DISCARD)
