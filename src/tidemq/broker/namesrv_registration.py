"""Keeping the name servers told about this broker: REGISTER_BROKER / UNREGISTER_BROKER.

A broker registers with every configured name server (docs/protocol.md §4.11, §11.5):

- once when it starts, before it is announced as started;
- every ``registerNameServerPeriod`` (30 s, clamped to 10-60 s): a name server drops a broker
  it has not heard from for 120 s;
- at once when its topic table changes (a topic created by a send or by an admin, deleted),
  so producers and consumers see the change within their next route refresh. A round for
  created or changed topics sends only those (RocketMQ's registerIncrementBrokerData): the
  whole table of a broker with 10,000 topics is megabytes for the broker to send and each
  name server to parse, so creating topics one after another cost the square of their
  number. The table's DataVersion travels with the increment; the periodic round sends the
  whole table. A removed topic leaves the name servers by DELETE_TOPIC_IN_NAMESRV (the
  admin sends it), so a removal triggers a whole-table round only to carry the new version.

One registration round sends REGISTER_BROKER to all name servers concurrently, each with its
own timeout (``registerBrokerTimeoutMills``), so a name server that is down or slow delays
nobody else. Failures are logged once per change of state per name server (up -> down,
down -> up), not every period.

Request: extFields brokerName, brokerAddr, clusterName, haServerAddr, brokerId, compressed
(false) and bodyCrc32 (CRC32 of the body, masked to 31 bits); body RegisterBrokerBody JSON::

    {"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":{...},
     "topicConfigTable":{"<topic>":TopicConfig,...}}}

Rounds never overlap: triggers that arrive during a round are folded into one more round
after it. A fenced broker (broker/role.py) sends no rounds until it is told its role.
Owner: the event loop (one task runs every round).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from typing import TYPE_CHECKING

from tidemq.broker.config import PERM_READ, PERM_WRITE
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import (
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnregisterBrokerRequestHeader,
)
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from tidemq.broker.config import BrokerConfig
    from tidemq.broker.identity import BrokerIdentity
    from tidemq.broker.role import ReplicationRole
    from tidemq.broker.topic_config_manager import TopicConfigManager

log = logging.getLogger("tidemq.broker")

# How often a slave that does not know its master yet registers again (each answer may name
# it); registerNameServerPeriod applies once it does.
SLAVE_WITHOUT_MASTER_PERIOD_S = 2.0


class NameServerRegistration:
    """Registers this broker with its name servers at start, periodically and on demand.

    Args:
        config: namesrvAddr, brokerPermission, registerNameServerPeriod,
            registerBrokerTimeoutMills.
        identity: the names, address and HA address registered.
        role: told the master's addresses a name server answers a slave with.
        topics: the topic table registered.
        client: the remoting client used to reach the name servers.
    """

    def __init__(
        self,
        *,
        config: BrokerConfig,
        identity: BrokerIdentity,
        role: ReplicationRole,
        topics: TopicConfigManager,
        client: RemotingClient,
    ) -> None:
        self._config = config
        self._identity = identity
        self._role = role
        self._topics = topics
        self._client = client
        self._wake = asyncio.Event()
        # Topics changed since the last round; None: the next round sends the whole table.
        self._changed_topics: set[str] | None = set()
        self._round_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        # Per name server: True after a success, False after a failure (None = not tried).
        self._reachable: dict[str, bool | None] = {}
        self.rounds_completed = 0
        self._fenced_logged: str | None = None

    @property
    def running(self) -> bool:
        """True between ``start`` (with name servers to register with) and ``stop``."""
        return self._task is not None

    @property
    def namesrv_addresses(self) -> list[str]:
        """The name servers registered with, from ``namesrvAddr``."""
        return self._config.namesrv_addresses

    async def start(self) -> None:
        """Register once (waiting for the round), then keep registering in the background."""
        if not self.namesrv_addresses:
            log.info(
                "broker %s has no name server to register with (namesrvAddr is not set)",
                self._config.broker_name,
            )
            return
        await self.register_all()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="tidemq-namesrv-registration"
        )

    def trigger(self, topics: tuple[str, ...] | None = None) -> None:
        """Ask for a registration round soon: of ``topics`` (created or changed), or of the
        whole table (None). Never blocks."""
        if topics is None:
            self._changed_topics = None
        elif self._changed_topics is not None:
            self._changed_topics.update(topics)
        self._wake.set()

    async def stop(self) -> None:
        """Stop the periodic task (a round in progress is cancelled)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        period_s = self._config.register_period_ms / 1000
        while True:
            # A slave whose master is not known yet (it started first) asks again soon: the
            # answer names the master, and the slave copies nothing until it knows it.
            wait_s = period_s
            if self._role.is_slave and self._role.master_ha_address is None:
                wait_s = min(period_s, SLAVE_WITHOUT_MASTER_PERIOD_S)
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
            # that arrives as the event is set, and stop() would wait forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()
            try:
                changed = self._changed_topics
                if changed is None or not self._wake.is_set():
                    await self.register_all()  # the period passed, or a removal
                else:
                    self._wake.clear()
                    if changed:  # empty: an admin's register_topics carried them already
                        await self.register_topics(changed)
            except Exception:  # a bug here must not end registration for good
                log.exception("name-server registration round failed")

    # -- one round -------------------------------------------------------------------------

    def register_body(self, topics: set[str] | None = None) -> bytes:
        """The RegisterBrokerBody JSON of the broker's current topic table, or of only
        ``topics`` (those still in it) with the table's DataVersion.

        A broker whose brokerPermission is not read-write (4 = read-only, 2 = write-only)
        registers every topic with that permission, as RocketMQ does, so clients stop
        writing to (or reading from) it.
        """
        if topics is None:
            wrapper = self._topics.serialize_wrapper()
        else:
            configs = {name: self._topics.get(name) for name in sorted(topics)}
            wrapper = {
                "dataVersion": self._topics.data_version.to_json_object(),
                "topicConfigTable": {name: config.to_json_object()
                                     for name, config in configs.items() if config is not None},
            }
        broker_permission = self._config.broker_permission
        if broker_permission & (PERM_READ | PERM_WRITE) != PERM_READ | PERM_WRITE:
            for topic_config in wrapper["topicConfigTable"].values():
                topic_config["perm"] = broker_permission
        return jsonx.dumps({"filterServerList": [], "topicConfigSerializeWrapper": wrapper})

    async def register_all(self) -> dict[str, bool]:
        """Send REGISTER_BROKER to every name server at once and wait for all answers.

        Returns:
            ``{name server: registered?}``; failures are logged (once per state change),
            never raised.
        """
        addresses = self.namesrv_addresses
        if not addresses or self._fenced():
            self._wake.clear()
            return {}
        async with self._round_lock:
            # Cleared right before the body is built: this round carries every change made
            # so far, and a change made from here on sets the event again.
            self._wake.clear()
            self._changed_topics = set()
            return await self._register_round(addresses, self.register_body())

    async def register_topics(self, topics: set[str] | list[str]) -> dict[str, bool]:
        """Send REGISTER_BROKER with only ``topics`` (created or changed) to every name server
        at once and wait for all answers (RocketMQ's registerIncrementBrokerData).

        Returns:
            As ``register_all``.
        """
        addresses = self.namesrv_addresses
        if not addresses or self._fenced():
            if self._changed_topics is not None:
                self._changed_topics -= set(topics)
            return {}
        async with self._round_lock:
            if self._changed_topics is None:
                # A whole table is due (a removal, or a name server missed an increment):
                # send it now, it carries ``topics`` too.
                self._wake.clear()
                self._changed_topics = set()
                return await self._register_round(addresses, self.register_body())
            # The body carries the table's current DataVersion, and a name server skips a
            # later body of the same version as unchanged. So this round takes every topic
            # changed so far, not only ``topics``: a topic created while this round waited
            # for the lock would otherwise reach the name servers only in a body they skip.
            wanted = set(topics) | self._changed_topics
            self._changed_topics = set()
            results = await self._register_round(addresses, self.register_body(wanted))
            if not all(results.values()):
                # A name server that missed this increment would take the next one's newer
                # version as proof it holds these topics; a whole table puts it right.
                self.trigger()
            return results

    def _fenced(self) -> bool:
        # A fenced master (it lost its controller lease; broker/role.py) registers nothing:
        # as brokerId 0 it would take the route back from the new master every period. The
        # name servers forget it after 120 s; its next role registers it again at once.
        reason = self._role.fenced_reason
        if reason != self._fenced_logged:
            self._fenced_logged = reason
            if reason is not None:
                log.warning("broker %s is fenced (%s): it stops registering with the name "
                            "servers until it is told its role", self._config.broker_name,
                            reason)
        return reason is not None

    async def _register_round(self, addresses: list[str], body: bytes) -> dict[str, bool]:
        identity = self._identity
        header = RegisterBrokerRequestHeader(
            broker_name=identity.broker_name,
            broker_addr=identity.address,
            cluster_name=identity.cluster_name,
            ha_server_addr=identity.ha_server_address,
            broker_id=identity.broker_id,
            compressed=False,
            body_crc32=zlib.crc32(body) & 0x7FFFFFFF,
        )
        ext_fields = header.to_ext_fields()
        results = await asyncio.gather(
            *(self._register_one(address, ext_fields, body) for address in addresses)
        )
        self.rounds_completed += 1
        return dict(zip(addresses, results, strict=True))

    async def _register_one(self, address: str, ext_fields: dict[str, str], body: bytes) -> bool:
        request = RemotingCommand.request(RequestCode.REGISTER_BROKER, ext_fields, body)
        timeout_ms = self._config.register_broker_timeout_ms
        try:
            response = await self._client.invoke(address, request, timeout_ms)
        except RemotingError as exc:
            self._note(address, False, str(exc))
            return False
        if response.code != ResponseCode.SUCCESS:
            self._note(address, False, f"it answered code {response.code}: {response.remark or ''}")
            return False
        self._note(address, True, "")
        if self._role.is_slave:
            answer = RegisterBrokerResponseHeader.from_ext_fields(response.ext_fields or {})
            self._role.learn_master(answer.master_addr, answer.ha_server_addr)
        return True

    def _note(self, address: str, reachable: bool, problem: str) -> None:
        before = self._reachable.get(address)
        self._reachable[address] = reachable
        if reachable and before is not True:
            log.info(
                "broker %s registered with name server %s%s",
                self._config.broker_name,
                address,
                " again" if before is False else "",
            )
        elif not reachable and before is not False:
            log.warning(
                "broker %s could not register with name server %s: %s; retrying every %d s "
                "(check namesrvAddr and that the name server runs)",
                self._config.broker_name,
                address,
                problem,
                self._config.register_period_ms // 1000,
            )

    async def unregister_all(self) -> None:
        """Send UNREGISTER_BROKER to every name server at once (at shutdown); never raises."""
        config = self._config
        identity = self._identity
        ext_fields = UnregisterBrokerRequestHeader(
            broker_name=identity.broker_name,
            broker_addr=identity.address,
            cluster_name=identity.cluster_name,
            broker_id=identity.broker_id,
        ).to_ext_fields()

        async def unregister_one(address: str) -> None:
            request = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, ext_fields)
            try:
                await self._client.invoke(address, request, config.register_broker_timeout_ms)
            except RemotingError as exc:
                log.info("could not unregister from name server %s: %s", address, exc)

        await asyncio.gather(*(unregister_one(a) for a in self.namesrv_addresses))
