"""Where the controller's records live in etcd (records.py says what they hold).

```
<prefix>/cluster                                  the cluster name (plain UTF-8): the marker
<prefix>/controllers/<id>                         a running `tidemq controller`, leased
<prefix>/groups/<brokerName>/state                GroupState
<prefix>/groups/<brokerName>/replicas/<brokerId>  ReplicaReport, under the process's lease
<prefix>/groups/<brokerName>/history/<epoch>      ElectionRecord; epoch zero-padded to 20
                                                  digits so keys sort by epoch
```
The prefix is ``controllerEtcdPrefix`` (default ``/tidemq``), one per cluster: the marker
refuses a broker of another cluster that points at the same prefix (etcd.py).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "/tidemq"


@dataclass(slots=True, frozen=True)
class Keys:
    """The key layout under one prefix."""

    prefix: str = DEFAULT_PREFIX

    @property
    def marker(self) -> bytes:
        return f"{self.prefix}/cluster".encode()

    @property
    def controllers(self) -> bytes:
        return f"{self.prefix}/controllers/".encode()

    @property
    def groups(self) -> bytes:
        return f"{self.prefix}/groups/".encode()

    def group(self, broker_name: str) -> bytes:
        return f"{self.prefix}/groups/{broker_name}/".encode()

    def state(self, broker_name: str) -> bytes:
        return f"{self.prefix}/groups/{broker_name}/state".encode()

    def replicas(self, broker_name: str) -> bytes:
        return f"{self.prefix}/groups/{broker_name}/replicas/".encode()

    def replica(self, broker_name: str, broker_id: int) -> bytes:
        return f"{self.prefix}/groups/{broker_name}/replicas/{broker_id}".encode()

    def history(self, broker_name: str) -> bytes:
        return f"{self.prefix}/groups/{broker_name}/history/".encode()

    def election(self, broker_name: str, epoch: int) -> bytes:
        return f"{self.prefix}/groups/{broker_name}/history/{epoch:020d}".encode()

    def group_name_of(self, key: bytes) -> str | None:
        """The brokerName of a key under ``groups``, None for another key."""
        text = key.decode(errors="replace")
        head = f"{self.prefix}/groups/"
        if not text.startswith(head):
            return None
        name, _, _ = text[len(head):].partition("/")
        return name or None
