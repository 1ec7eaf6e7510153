"""Reconciling a switched slave with its new master by epochs, before it copies anything.

A broker told to become a slave (ReplicationRole.become_slave) may hold a log its new master
does not: an old master coming back holds the records it appended after its last slave
acknowledgement. The HA stream cannot say so (it has no handshake), so before streaming the
slave asks its master over the remoting port:

    GET_BROKER_EPOCH_CACHE (1007, RocketMQ 5's code)  ->  body JSON
    {"clusterName": .., "brokerName": .., "brokerId": 0,
     "epochList": [{"epoch": 1, "startOffset": 0, "endOffset": 4096}, ...],
     "maxOffset": <the master's commit-log end>}

and then

1. computes the divergence point from both epoch lists (store/epochs.py,
   ``divergence_offset``): the end of the last epoch both logs hold;
2. truncates its log there when it ends later (``StoreCore.truncate_to``: commit log, consume
   queues, index, epoch file; crash-safe), and the role logs exactly what was dropped
   (offsets, count, msgIds);
3. takes the master's epoch list as its own (its log is now a prefix of the master's).

The HA client then runs its usual master check (master_check.py), which compares the last
record byte for byte: epochs say where the logs may agree, the check proves they do.

Only a slave made by a role switch reconciles: a slave from a static config (brokerRole=SLAVE)
keeps the never-truncate rule of issue 11 and refuses a divergent log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from tidemq.broker.ha.master_check import MasterUnreachable
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting.client import RemotingClient
from tidemq.store.epochs import EpochEntry, divergence_offset, epoch_ranges
from tidemq.store.truncation import Truncation

log = logging.getLogger("tidemq.broker.ha")

_REQUEST_TIMEOUT_MS = 3000


def epoch_cache_body(cluster_name: str, broker_name: str, broker_id: int,
                     entries: list[EpochEntry], max_offset: int) -> dict[str, Any]:
    """The GET_BROKER_EPOCH_CACHE answer's body (module docstring)."""
    return {
        "clusterName": cluster_name,
        "brokerName": broker_name,
        "brokerId": broker_id,
        "epochList": [
            {"epoch": r.epoch, "startOffset": r.start_offset, "endOffset": r.end_offset}
            for r in epoch_ranges(entries, max_offset) if r.epoch != 0
        ],
        "maxOffset": max_offset,
    }


def parse_epoch_cache(body: bytes) -> tuple[str, list[EpochEntry], int]:
    """(brokerName, entries, maxOffset) of a GET_BROKER_EPOCH_CACHE body.

    Raises:
        ValueError: the body is not such an answer.
    """
    data = jsonx.loads(body or b"{}")
    if not isinstance(data, dict) or not isinstance(data.get("epochList", []), list):
        raise ValueError("not an epoch cache answer (no epochList)")
    entries = [EpochEntry(int(item["epoch"]), int(item["startOffset"]))
               for item in data.get("epochList") or []]
    return str(data.get("brokerName", "")), entries, int(data.get("maxOffset", 0))


class Reconciler:
    """Brings a switched slave's log back to a prefix of its master's (module docstring).

    Args:
        client: the broker's remoting client.
        store: the slave's store (``epochs``, ``commit_log_max_offset``, ``truncate_to``).
        broker_name: this broker's brokerName (a master of another name is refused).
        on_truncation: told what each truncation dropped (the role logs it).
    """

    def __init__(self, client: RemotingClient, store: Any, broker_name: str,
                 on_truncation: Callable[[Truncation], None]) -> None:
        self._client = client
        self._store = store
        self._broker_name = broker_name
        self._on_truncation = on_truncation

    async def reconcile(self, master_addr: str) -> str | None:
        """Truncate this log where it leaves the master's and adopt the master's epochs.

        Returns:
            None when done, or why this slave must not copy (another brokerName).
        Raises:
            MasterUnreachable: the master did not answer (retry later).
        """
        request = RemotingCommand.request(RequestCode.GET_BROKER_EPOCH_CACHE, {})
        try:
            response = await self._client.invoke(master_addr, request, _REQUEST_TIMEOUT_MS)
        except Exception as e:  # remoting errors: "not now"
            raise MasterUnreachable(f"{master_addr} did not answer its epochs: {e}") from e
        if response.code != ResponseCode.SUCCESS:
            raise MasterUnreachable(f"{master_addr} answered GET_BROKER_EPOCH_CACHE with code "
                                    f"{response.code}: {response.remark or ''}")
        try:
            name, remote, remote_end = parse_epoch_cache(response.body or b"")
        except (ValueError, KeyError, TypeError) as e:
            raise MasterUnreachable(f"{master_addr} answered epochs that do not parse: {e}"
                                    ) from e
        if name != self._broker_name:
            return (f"the master at {master_addr} is broker {name!r}, this slave is "
                    f"{self._broker_name!r}: it copies only its own brokerName's master")
        store = self._store
        epochs = store.epochs
        local_end = store.commit_log_max_offset()
        point = divergence_offset(epochs.entries, local_end, remote, remote_end)
        if point < local_end:
            log.warning(
                "broker %s: its log leaves master %s's at offset %d (its epochs %s, the "
                "master's %s, master log end %d); truncating %d bytes", self._broker_name,
                master_addr, point, _show(epochs.entries), _show(remote), remote_end,
                local_end - point)
            self._on_truncation(await asyncio.to_thread(store.truncate_to, point))
        epochs.replace(remote)
        return None


def _show(entries: list[EpochEntry]) -> str:
    return "[" + ", ".join(f"{e.epoch}@{e.start_offset}" for e in entries) + "]"
