"""KVConfigManager: the name server's namespaced key/value settings (PUT/GET/DELETE_KV_CONFIG).

Admin tools keep small settings here, e.g. namespace ORDER_TOPIC_CONFIG maps an ordered topic
to "brokerName:queueNums;..." which route answers then carry as ``orderTopicConf``.

When a path is given the table survives restarts in RocketMQ's kvConfig.json shape::

    {"configTable":{"<namespace>":{"<key>":"<value>",...},...}}

Each change rewrites the whole file atomically (write ``<file>.tmp``, fsync, rename over the
file, fsync the directory), so a crash leaves either the old or the new table, never half of
one. The table is small (a few settings), so rewriting it whole costs nothing worth saving.
Owned by the name server's event loop; nothing is locked.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tidemq.errors import ConfigError, ConfigFileCorrupt
from tidemq.protocol import jsonx

log = logging.getLogger("tidemq.namesrv")


class KVConfigManager:
    """Namespaced string settings, optionally persisted to one JSON file.

    Args:
        path: the kvConfig.json file, or None to keep the table in memory only.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path).expanduser() if path else None
        self._table: dict[str, dict[str, str]] = {}

    def load(self) -> None:
        """Read the file, if there is one.

        Raises:
            ConfigFileCorrupt: the file exists but is not the kvConfig.json shape.
        """
        if self.path is None or not self.path.exists():
            return
        try:
            document = jsonx.loads(self.path.read_bytes())
            table = document["configTable"] if isinstance(document, dict) else None
            if not isinstance(table, dict) or not all(
                isinstance(entries, dict) for entries in table.values()
            ):
                raise ValueError("no configTable object of namespaces")
        except (OSError, ValueError, KeyError, jsonx.JsonDecodeError) as e:
            raise ConfigFileCorrupt(
                f"KV config file {self.path} is unreadable ({e}); restore it or delete it "
                "(the name server then starts with an empty KV config)"
            ) from None
        self._table = {
            str(namespace): {str(k): str(v) for k, v in entries.items()}
            for namespace, entries in table.items()
        }
        log.info("loaded %d KV config namespace(s) from %s", len(self._table), self.path)

    def put(self, namespace: str, key: str, value: str) -> None:
        """Set ``key`` in ``namespace`` (and persist)."""
        entries = self._table.setdefault(namespace, {})
        previous = entries.get(key)
        entries[key] = value
        if previous != value:
            log.info("KV config %s/%s = %r (was %r)", namespace, key, value, previous)
            self._persist()

    def get(self, namespace: str, key: str) -> str | None:
        """The value of ``key`` in ``namespace``, or None."""
        return self._table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> None:
        """Remove ``key`` from ``namespace`` (and persist); absent keys are fine."""
        entries = self._table.get(namespace)
        if entries is not None and entries.pop(key, None) is not None:
            if not entries:
                del self._table[namespace]
            log.info("KV config %s/%s deleted", namespace, key)
            self._persist()

    def namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of every entry of ``namespace``, or None when it has none."""
        entries = self._table.get(namespace)
        return dict(entries) if entries else None

    def _persist(self) -> None:
        if self.path is None:
            return
        data = jsonx.dumps({"configTable": self._table}, pretty=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(temporary, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except OSError as e:
            raise ConfigError(
                f"cannot write KV config file {self.path}: {e.strerror or e} (check the "
                "directory of kvConfigPath is writable)"
            ) from None
