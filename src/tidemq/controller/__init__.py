"""Automatic failover: per broker group the master, its epoch and the sync-state set, in etcd.

tidemq runs no consensus of its own: every durable decision is an etcd transaction
(compare-and-set on the group's state key), and liveness is an etcd lease per broker process.
Any number of processes may therefore make decisions at once (``tidemq controller``
instances, ``tidemq admin electMaster``, the brokers' agents for their sync-state sets);
exactly one of two racing decisions commits.

- ``records``: the JSON values stored in etcd (group state, replica reports, elections);
- ``keys``: where they live under the cluster's prefix;
- ``etcd``: a small asyncio wrapper over the etcd v3 client (aetcd) that speaks in records;
- ``election``: the rules (who may become master), pure functions;
- ``service``: the controller loop that elects when a master's lease expired.

docs/failover.md is the operator's page.
"""
