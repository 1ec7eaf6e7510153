"""BrokerIdentity: who this broker is and where it serves (known for sure only once bound).

The names come from the config (brokerClusterName, brokerName, brokerId). The address is
brokerIP1:listenPort, except that a broker told to listen on port 0 (tests) learns its port
when the remoting server binds; ``bound`` records it, and every part that names this broker
in a remark, a registration or a stored record reads ``address`` at that moment.
"""

from __future__ import annotations

from tidemq.broker.config import BrokerConfig


class BrokerIdentity:
    """The broker's names and its client-facing and HA addresses.

    Args:
        config: the broker's settings (names, brokerIP1/2, listenPort, haListenPort).
    """

    def __init__(self, config: BrokerConfig) -> None:
        self._config = config
        self.address: str = config.broker_address
        self._broker_id = config.broker_id

    @property
    def cluster_name(self) -> str:
        """brokerClusterName."""
        return self._config.broker_cluster_name

    @property
    def broker_name(self) -> str:
        """brokerName: the key of routes, queue assignments and client-side offsets."""
        return self._config.broker_name

    @property
    def broker_id(self) -> int:
        """brokerId: 0 for a master, 1, 2, ... for slaves (the config's, until a role
        switch gives another: ``switched``)."""
        return self._broker_id

    def switched(self, broker_id: int) -> None:
        """A role switch made this broker ``broker_id`` (0: the master)."""
        self._broker_id = broker_id

    def bound(self, port: int) -> None:
        """Record the port the server bound when listenPort was 0."""
        self.address = f"{self._config.broker_ip1}:{port}"

    @property
    def ha_server_address(self) -> str:
        """``brokerIP2:haListenPort`` (haListenPort = the bound listenPort + 1 unless set)."""
        config = self._config
        if config.ha_listen_port is not None:
            return config.ha_server_address
        port = int(self.address.rpartition(":")[2]) + 1
        return f"{config.broker_ip2 or config.broker_ip1}:{port}"
