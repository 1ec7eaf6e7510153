"""ClientInstance: what producers, consumers and the admin client share per client object.

Theory of operation. A ClientInstance owns one ``RemotingClient`` (one connection per
address), the list of name servers, a cache of topic routes and the broker address table
derived from them, and two periodic tasks:

- route refresh every ``poll_name_server_interval_ms`` (RocketMQ's pollNameServerInterval,
  30 s) for every topic in the cache; listeners (the producer's publish info, the consumer's
  queue lists) hear about routes that changed;
- heartbeat every ``heartbeat_broker_interval_ms`` (30 s) to every master broker known, with
  the producer and consumer groups its owner reports (docs/protocol.md §4.6, §5.1).

Name servers are tried in turn: requests go to the one that answered last; when it fails with
a transport error the next is tried, and so on once round the list. Name servers keep no state
between them, so any one of them is as good as another.

Everything runs on the event loop of the owner; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from tidemq.client.errors import BrokerRejected, NameServerUnavailable, NoRouteError
from tidemq.client.route import MASTER_ID, TopicRouteData, parse_topic_route
from tidemq.client.security import Credentials, TlsOption, resolve_tls
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.headers import MESSAGE_PATH_HEADERS, compile_codecs
from tidemq.remoting.client import RemotingClient
from tidemq.remoting.errors import RemotingError

log = logging.getLogger("tidemq.client")

# RocketMQ ClientConfig defaults (docs/protocol.md §11.5).
POLL_NAME_SERVER_INTERVAL_MS = 30_000
HEARTBEAT_BROKER_INTERVAL_MS = 30_000
REQUEST_TIMEOUT_MS = 3_000  # mqClientApiTimeout

RouteListener = Callable[[str, TopicRouteData], None]
HeartbeatSource = Callable[[], tuple[list[dict[str, Any]], list[dict[str, Any]]]]


def parse_namesrv_addresses(namesrv: str | Iterable[str]) -> list[str]:
    """Split ``"host:port;host:port"`` (``;`` or ``,``) or a list into addresses.

    Raises:
        ValueError: no address given, or one without ``:port``.
    """
    if isinstance(namesrv, str):
        pieces = namesrv.replace(",", ";").split(";")
    else:
        pieces = list(namesrv)
    addresses = [p.strip() for p in pieces if p and p.strip()]
    if not addresses:
        raise ValueError(
            "no name server address given; pass namesrv='host:port' (several joined by ';')"
        )
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(
                f"name server address {address!r} is not host:port (e.g. 127.0.0.1:9876)"
            )
    return addresses


def local_ip() -> str:
    """This host's outward IPv4 address, or 127.0.0.1 when none can be found."""
    try:
        # UDP connect sends nothing; it only makes the kernel choose a source address.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def default_instance_name() -> str:
    """RocketMQ 4.9's replacement for instance name DEFAULT: ``<pid>#<nanoTime>``."""
    return f"{os.getpid()}#{time.monotonic_ns()}"


def check_response(response: RemotingCommand, what: str, address: str,
                   ok_codes: frozenset[int] = frozenset({ResponseCode.SUCCESS})) -> None:
    """Raise BrokerRejected unless ``response.code`` is one of ``ok_codes``."""
    if response.code not in ok_codes:
        raise BrokerRejected(what, response.code, response.remark, address)


class ClientInstance:
    """Name-server access, route cache, broker addresses and heartbeats for one client.

    Args:
        namesrv: name server addresses, ``"host:port;host:port"`` or a list.
        instance_name: this client's instance name (part of its client id); default
            ``<pid>#<nanoTime>``.
        request_timeout_ms: timeout of name-server and admin requests.
        poll_name_server_interval_ms: how often cached routes are refreshed.
        heartbeat_broker_interval_ms: how often heartbeats go to every master.
        unit_name: appended to the client id when given (RocketMQ unit mode).
        credentials: ACL keys; every request to name servers and brokers is signed.
        tls: connect with TLS (``tidemq.client.security``): True, an ``ssl.SSLContext``,
            or None/False for plain TCP.

    Raises:
        ValueError: a malformed name server address.
    """

    def __init__(
        self,
        namesrv: str | Iterable[str],
        *,
        instance_name: str | None = None,
        request_timeout_ms: int = REQUEST_TIMEOUT_MS,
        poll_name_server_interval_ms: int = POLL_NAME_SERVER_INTERVAL_MS,
        heartbeat_broker_interval_ms: int = HEARTBEAT_BROKER_INTERVAL_MS,
        unit_name: str | None = None,
        credentials: Credentials | None = None,
        tls: TlsOption = None,
    ):
        self.namesrv_addresses = parse_namesrv_addresses(namesrv)
        self.instance_name = instance_name or default_instance_name()
        self.client_ip = local_ip()
        self.client_id = f"{self.client_ip}@{self.instance_name}"
        if unit_name:
            self.client_id += f"@{unit_name}"
        self.request_timeout_ms = request_timeout_ms
        self.poll_name_server_interval_ms = poll_name_server_interval_ms
        self.heartbeat_broker_interval_ms = heartbeat_broker_interval_ms
        self.credentials = credentials
        self.tls_context = resolve_tls(tls)
        self.remoting = RemotingClient(
            request_hook=credentials.request_hook() if credentials is not None else None,
            tls=self.tls_context,
        )
        self.routes: dict[str, TopicRouteData] = {}
        # Topics to keep refreshing although no route was found yet (a producer writing to a
        # topic the broker auto-creates on the first send).
        self.topics_of_interest: set[str] = set()
        self.broker_addresses: dict[str, dict[int, str]] = {}
        self.route_listeners: list[RouteListener] = []
        self.heartbeat_sources: list[HeartbeatSource] = []
        self._namesrv_index = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._refreshing: dict[str, asyncio.Task[TopicRouteData | None]] = {}
        self.started = False
        self.closed = False
        # The event loop start() ran on, for the per-request paths: asyncio's running-loop
        # lookup costs a getpid system call on Python 3.11, several per message otherwise.
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the periodic route refresh and heartbeat tasks. Idempotent."""
        if self.started:
            return
        self.started = True
        loop = self.loop = asyncio.get_running_loop()
        # Now, not at the first send or pull (~0.3-1 ms each on the loop).
        compile_codecs(*MESSAGE_PATH_HEADERS)
        self._tasks.append(loop.create_task(
            self._every(self.poll_name_server_interval_ms, self.refresh_all_routes,
                        "route refresh")))
        self._tasks.append(loop.create_task(
            self._every(self.heartbeat_broker_interval_ms, self.send_heartbeat, "heartbeat")))

    async def close(self) -> None:
        """Stop the periodic tasks and close every connection. Idempotent."""
        if self.closed:
            return
        self.closed = True
        tasks = self._tasks + list(self._refreshing.values()) + list(self._background)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.remoting.close()

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run ``coroutine`` in the background; it is cancelled by ``close``."""
        if self.closed:
            coroutine.close()
            return
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _every(self, interval_ms: int, action: Callable[[], Any], what: str) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await action()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a periodic task must survive a bad round
                log.warning("%s of client %s failed: %s", what, self.client_id, e)

    # -- name servers ----------------------------------------------------------------------

    async def invoke_namesrv(
        self,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> RemotingCommand:
        """Send a request to a name server, trying each in turn on transport errors.

        Returns:
            The first response received, whatever its code.

        Raises:
            NameServerUnavailable: no name server answered.
        """
        addresses = self.namesrv_addresses
        timeout = timeout_ms or self.request_timeout_ms
        errors: list[str] = []
        for step in range(len(addresses)):
            index = (self._namesrv_index + step) % len(addresses)
            address = addresses[index]
            request = RemotingCommand.request(code, dict(ext_fields) if ext_fields else None,
                                              body)
            try:
                response = await self.remoting.invoke(address, request, timeout)
            except RemotingError as e:
                errors.append(f"{address}: {e}")
                continue
            self._namesrv_index = index
            return response
        raise NameServerUnavailable(
            "no name server answered (" + "; ".join(errors) + "); check that they run and "
            "that namesrv= lists their host:port"
        )

    async def fetch_route(self, topic: str) -> TopicRouteData | None:
        """Ask the name servers for ``topic``'s route; None when no broker serves it.

        A found route is cached, its brokers' addresses are learnt, and route listeners are
        told when it differs from the cached one.

        Raises:
            NameServerUnavailable: no name server answered.
            BrokerRejected: a name server answered with an unexpected error code.
        """
        response = await self.invoke_namesrv(RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                             {"topic": topic})
        if response.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        check_response(response, f"route lookup of topic {topic!r}", "name server")
        route = parse_topic_route(response.body or b"{}")
        self._learn_brokers(route)
        previous = self.routes.get(topic)
        self.routes[topic] = route
        if previous != route:
            for listener in list(self.route_listeners):
                listener(topic, route)
        return route

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData | None:
        """The cached route of ``topic``, fetched first when absent or when ``refresh``."""
        if not refresh:
            cached = self.routes.get(topic)
            if cached is not None:
                return cached
        return await self.fetch_route(topic)

    def refresh_route_soon(self, topic: str) -> None:
        """Refresh ``topic``'s route in the background (after a send error); deduplicated."""
        if self.closed or topic in self._refreshing:
            return
        task = asyncio.get_running_loop().create_task(self._refresh_quietly(topic))
        self._refreshing[topic] = task
        task.add_done_callback(lambda _: self._refreshing.pop(topic, None))

    async def _refresh_quietly(self, topic: str) -> TopicRouteData | None:
        try:
            return await self.fetch_route(topic)
        except Exception as e:
            log.info("route refresh of topic %r failed: %s", topic, e)
            return None

    async def refresh_all_routes(self) -> None:
        """Refresh every cached route (the periodic task)."""
        for topic in sorted(set(self.routes) | self.topics_of_interest):
            await self._refresh_quietly(topic)

    def _learn_brokers(self, route: TopicRouteData) -> None:
        for broker in route.broker_datas:
            self.broker_addresses[broker.broker_name] = dict(broker.broker_addrs)

    # -- brokers ---------------------------------------------------------------------------

    def master_address(self, broker_name: str) -> str | None:
        """The master address of ``broker_name`` from the routes seen, or None."""
        addresses = self.broker_addresses.get(broker_name)
        return addresses.get(MASTER_ID) if addresses else None

    def read_address(self, broker_name: str) -> str | None:
        """Where to read (pull, query) from ``broker_name``: the master, else its first slave."""
        addresses = self.broker_addresses.get(broker_name)
        if not addresses:
            return None
        master = addresses.get(MASTER_ID)
        return master if master is not None else addresses[min(addresses)]

    async def find_master(self, broker_name: str, topic: str | None = None) -> str:
        """The master address of ``broker_name``, refreshing ``topic``'s route once if unknown.

        Raises:
            NoRouteError: no route names a master for that broker.
        """
        address = self.master_address(broker_name)
        if address is None and topic is not None:
            await self.fetch_route(topic)
            address = self.master_address(broker_name)
        if address is None:
            raise NoRouteError(
                f"no master address known for broker {broker_name!r}"
                + (f" (topic {topic!r})" if topic else "")
                + "; is the broker registered with the name server?"
            )
        return address

    def master_addresses(self) -> list[str]:
        """Every known master address, sorted."""
        return sorted(
            addrs[MASTER_ID] for addrs in self.broker_addresses.values() if MASTER_ID in addrs
        )

    async def invoke(
        self,
        address: str,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes | None = None,
        *,
        timeout_ms: int | None = None,
    ) -> RemotingCommand:
        """Send one request to ``address`` and return the response, whatever its code.

        Raises:
            RemotingError: transport failure (connect, timeout, closed); retriable.
        """
        request = RemotingCommand.request(code, dict(ext_fields) if ext_fields else None, body)
        return await self.remoting.invoke(address, request, timeout_ms or self.request_timeout_ms)

    # -- heartbeats ------------------------------------------------------------------------

    def heartbeat_body(self) -> bytes:
        """The HeartbeatData JSON of everything registered on this instance."""
        producers, consumers = self._heartbeat_data()
        return _heartbeat_json(self.client_id, producers, consumers)

    def _heartbeat_data(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        producers: list[dict[str, Any]] = []
        consumers: list[dict[str, Any]] = []
        for source in self.heartbeat_sources:
            produced, consumed = source()
            producers.extend(produced)
            consumers.extend(consumed)
        return producers, consumers

    async def send_heartbeat(self) -> None:
        """Send the heartbeat to every known master, and to every slave too when this instance
        has consumers (a slave serves their pulls and names their group's members when the
        master is gone, as in RocketMQ); failures are logged, not raised."""
        if not self.heartbeat_sources:
            return
        producers, consumers = self._heartbeat_data()
        body = _heartbeat_json(self.client_id, producers, consumers)
        addresses = sorted(
            address for group in self.broker_addresses.values()
            for broker_id, address in group.items() if broker_id == MASTER_ID or consumers
        )
        results = await asyncio.gather(
            *(self.invoke(a, RequestCode.HEART_BEAT, None, body) for a in addresses),
            return_exceptions=True,
        )
        for address, result in zip(addresses, results, strict=True):
            if isinstance(result, BaseException):
                log.info("heartbeat to broker %s failed: %s", address, result)
            elif result.code != ResponseCode.SUCCESS:
                log.warning("broker %s refused the heartbeat of %s: code %s %s", address,
                            self.client_id, result.code, result.remark or "")

    async def unregister(self, producer_group: str | None = None,
                         consumer_group: str | None = None) -> None:
        """Tell every known master this client leaves a group (UNREGISTER_CLIENT); best effort."""
        fields = {"clientID": self.client_id}
        if producer_group:
            fields["producerGroup"] = producer_group
        if consumer_group:
            fields["consumerGroup"] = consumer_group
        results = await asyncio.gather(
            *(self.invoke(a, RequestCode.UNREGISTER_CLIENT, fields)
              for a in self.master_addresses()),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                log.debug("unregister of %s failed: %s", self.client_id, result)


def _heartbeat_json(client_id: str, producers: list[dict[str, Any]],
                    consumers: list[dict[str, Any]]) -> bytes:
    return jsonx.dumps(
        {"clientID": client_id, "consumerDataSet": consumers, "producerDataSet": producers}
    )
