"""The values the controller keeps in etcd, one JSON document per key (keys.py says where).

- ``GroupState`` (``<prefix>/groups/<brokerName>/state``): the group's master (brokerId,
  remoting and HA address, the etcd lease of the master's process), the master epoch and the
  sync-state set. Changed only by compare-and-set on the key's mod revision, so the epoch
  grows by exactly one per election and two deciders never both win.
- ``ReplicaReport`` (``<prefix>/groups/<brokerName>/replicas/<brokerId>``): written by each
  broker's agent every heartbeat under its process's lease: address, HA address, the offset
  it has confirmed (its commit log's max offset), the epoch it takes part in. The key
  vanishes when the lease expires: that is how a dead broker is seen.
- ``ElectionRecord`` (``<prefix>/groups/<brokerName>/history/<epoch>``): one per epoch, why
  and how its master was chosen, and, under ASYNC_MASTER, the window of bytes the old master
  may have acknowledged that the new one lacks.

Field names are camelCase in JSON, like RocketMQ 5's controller answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson


class RecordError(ValueError):
    """A value in etcd is not the JSON document tidemq writes there."""


def _object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise RecordError(f"{what} is not JSON ({e}): {raw[:80]!r}") from e
    if not isinstance(value, dict):
        raise RecordError(f"{what} is not a JSON object: {raw[:80]!r}")
    return value


def _int(value: dict[str, Any], key: str, what: str) -> int:
    item = value.get(key)
    if not isinstance(item, int) or isinstance(item, bool):
        raise RecordError(f"{what}: field {key!r} must be an integer, not {item!r}")
    return item


def _str(value: dict[str, Any], key: str, what: str) -> str:
    item = value.get(key, "")
    if not isinstance(item, str):
        raise RecordError(f"{what}: field {key!r} must be a string, not {item!r}")
    return item


@dataclass(slots=True, frozen=True)
class GroupState:
    """One broker group's master, epoch and sync-state set (module docstring)."""

    broker_name: str
    master_epoch: int
    master_broker_id: int
    master_address: str
    master_ha_address: str
    master_lease: int  # the etcd lease id of the master's process
    sync_state_set: frozenset[int]
    sync_state_set_epoch: int = 0  # grows with every change of the set
    # brokerRole flavour of the master: SYNC_MASTER or ASYNC_MASTER
    master_flavour: str = "SYNC_MASTER"

    def to_json(self) -> bytes:
        return orjson.dumps({
            "brokerName": self.broker_name,
            "masterEpoch": self.master_epoch,
            "masterBrokerId": self.master_broker_id,
            "masterAddress": self.master_address,
            "masterHaAddress": self.master_ha_address,
            "masterLease": self.master_lease,
            "syncStateSet": sorted(self.sync_state_set),
            "syncStateSetEpoch": self.sync_state_set_epoch,
            "masterFlavour": self.master_flavour,
        })

    @classmethod
    def from_json(cls, raw: bytes) -> GroupState:
        what = "group state"
        value = _object(raw, what)
        members = value.get("syncStateSet")
        if not isinstance(members, list) or not all(
            isinstance(m, int) and not isinstance(m, bool) for m in members
        ):
            raise RecordError(f"{what}: syncStateSet must be a list of brokerIds, not {members!r}")
        return cls(
            broker_name=_str(value, "brokerName", what),
            master_epoch=_int(value, "masterEpoch", what),
            master_broker_id=_int(value, "masterBrokerId", what),
            master_address=_str(value, "masterAddress", what),
            master_ha_address=_str(value, "masterHaAddress", what),
            master_lease=_int(value, "masterLease", what),
            sync_state_set=frozenset(members),
            sync_state_set_epoch=_int(value, "syncStateSetEpoch", what),
            master_flavour=_str(value, "masterFlavour", what) or "SYNC_MASTER",
        )

    def to_dict(self) -> dict[str, Any]:
        """The state as `tidemq admin --json` prints it."""
        result = orjson.loads(self.to_json())
        assert isinstance(result, dict)
        return result


@dataclass(slots=True, frozen=True)
class ReplicaReport:
    """What one broker process says of itself, under its lease (module docstring)."""

    broker_id: int
    address: str
    ha_address: str
    confirmed_offset: int  # the broker's commit-log max offset when it wrote this
    epoch: int  # the master epoch it takes part in (0: none yet)
    role: str  # "MASTER", "SLAVE" or "FENCED" / "STARTING" as the agent sees itself
    # A slave's local address of its HA connection, as its master sees the peer: how the
    # master tells which HA connection is which replica (the HA stream has no handshake).
    ha_client_address: str = ""
    lease: int = 0  # filled in from the key's lease when read back
    report_revision: int = 0  # the etcd mod revision of the key when read back

    def to_json(self) -> bytes:
        return orjson.dumps({
            "brokerId": self.broker_id,
            "address": self.address,
            "haAddress": self.ha_address,
            "confirmedOffset": self.confirmed_offset,
            "epoch": self.epoch,
            "role": self.role,
            "haClientAddress": self.ha_client_address,
        })

    @classmethod
    def from_json(cls, raw: bytes, *, lease: int = 0, revision: int = 0) -> ReplicaReport:
        what = "replica report"
        value = _object(raw, what)
        return cls(
            broker_id=_int(value, "brokerId", what),
            address=_str(value, "address", what),
            ha_address=_str(value, "haAddress", what),
            confirmed_offset=_int(value, "confirmedOffset", what),
            epoch=_int(value, "epoch", what),
            role=_str(value, "role", what),
            ha_client_address=_str(value, "haClientAddress", what),
            lease=lease,
            report_revision=revision,
        )


@dataclass(slots=True, frozen=True)
class ElectionRecord:
    """How one epoch's master was chosen (module docstring).

    ``loss_from_offset``/``loss_to_offset``: under ASYNC_MASTER, the bytes the previous master
    reported having (up to ``loss_to_offset``) beyond what the new master had when elected
    (``loss_from_offset``); equal when nothing can have been lost.
    """

    epoch: int
    broker_name: str
    master_broker_id: int
    master_address: str
    reason: str
    previous_master_broker_id: int | None
    candidate_offsets: dict[int, int] = field(default_factory=dict)
    start_offset: int = 0  # the new master's confirmed offset when elected
    loss_from_offset: int = 0
    loss_to_offset: int = 0
    flavour: str = "SYNC_MASTER"
    elected_at_ms: int = 0

    @property
    def possible_loss_bytes(self) -> int:
        """Bytes the old master may have acknowledged that the new master never got."""
        return max(self.loss_to_offset - self.loss_from_offset, 0)

    def to_json(self) -> bytes:
        return orjson.dumps({
            "epoch": self.epoch,
            "brokerName": self.broker_name,
            "masterBrokerId": self.master_broker_id,
            "masterAddress": self.master_address,
            "reason": self.reason,
            "previousMasterBrokerId": self.previous_master_broker_id,
            "candidateOffsets": {str(k): v for k, v in sorted(self.candidate_offsets.items())},
            "startOffset": self.start_offset,
            "lossFromOffset": self.loss_from_offset,
            "lossToOffset": self.loss_to_offset,
            "possibleLossBytes": self.possible_loss_bytes,
            "flavour": self.flavour,
            "electedAtMs": self.elected_at_ms,
        })

    @classmethod
    def from_json(cls, raw: bytes) -> ElectionRecord:
        what = "election record"
        value = _object(raw, what)
        previous = value.get("previousMasterBrokerId")
        offsets = value.get("candidateOffsets") or {}
        if not isinstance(offsets, dict):
            raise RecordError(f"{what}: candidateOffsets must be an object, not {offsets!r}")
        return cls(
            epoch=_int(value, "epoch", what),
            broker_name=_str(value, "brokerName", what),
            master_broker_id=_int(value, "masterBrokerId", what),
            master_address=_str(value, "masterAddress", what),
            reason=_str(value, "reason", what),
            previous_master_broker_id=previous if isinstance(previous, int) else None,
            candidate_offsets={int(k): int(v) for k, v in offsets.items()},
            start_offset=_int(value, "startOffset", what),
            loss_from_offset=_int(value, "lossFromOffset", what),
            loss_to_offset=_int(value, "lossToOffset", what),
            flavour=_str(value, "flavour", what) or "SYNC_MASTER",
            elected_at_ms=_int(value, "electedAtMs", what),
        )

    def to_dict(self) -> dict[str, Any]:
        """The record as `tidemq admin --json` prints it."""
        result = orjson.loads(self.to_json())
        assert isinstance(result, dict)
        return result
