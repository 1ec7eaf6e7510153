"""AclService: the ACL of one server — its file, hot reload, the request guard, and changes.

Theory of operation
-------------------
At construction the file is loaded; a missing or broken file raises ``AclFileError``, so a
server with ``aclEnable=true`` refuses to start rather than run open (or shut).

``start`` runs a poll every ``poll_interval_s`` (1 s): when the file's (mtime, size, inode)
changed, it is read again. A good file replaces the rules at once (one attribute swap on the
event loop: every check sees the old rules or the new, never a mix). A file that does not
parse leaves the previous rules in force and logs a WARNING saying why, once per change of
the file. RocketMQ watches the file the same way (``AclFileWatchService``, 500 ms polls of
the modification time).

Changes through requests (UPDATE_AND_CREATE_ACL_CONFIG, DELETE_ACL_CONFIG,
UPDATE_GLOBAL_WHITE_ADDRS_CONFIG) edit the document as last read, check the result exactly as
a load would, write it atomically with a new dataVersion and put the new rules in force; a
change that would not load is refused and the file is left alone.

Everything runs on the server's event loop; the file is small, and reading it there is
quicker than a hop to a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemq.acl.acl_file import (
    ACCOUNTS,
    GLOBAL_WHITE,
    AclFileError,
    AclRules,
    load_acl_file,
    parse_account,
    parse_acl_document,
    write_acl_document,
)
from tidemq.acl.validator import DEFER_SIGNATURE_BODY_BYTES_MIN, AclValidator, PendingSignature

if TYPE_CHECKING:
    from tidemq.protocol.command import RemotingCommand

log = logging.getLogger("tidemq.acl")

# How often the file's modification time is looked at. RocketMQ polls every 500 ms; a second
# is as quick for a person editing the file, and half the stat calls.
ACL_POLL_INTERVAL_S = 1.0

# The account fields an UPDATE_AND_CREATE_ACL_CONFIG may set, in the order they are written.
ACCOUNT_FIELDS = ("accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
                  "defaultGroupPerm", "topicPerms", "groupPerms")

_FileStamp = tuple[int, int, int]


def _stamp(path: Path) -> _FileStamp | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size, status.st_ino


class AclService:
    """Loads ``path``, keeps it in force, checks requests and applies ACL changes.

    Args:
        path: the ``plain_acl.yml`` to enforce.
        checked_codes: see ``AclValidator`` (the name server passes its write codes).
        poll_interval_s: how often the file is looked at for changes.

    Raises:
        AclFileError: the file is missing or invalid (the server must not start).
    """

    def __init__(
        self,
        path: Path,
        *,
        checked_codes: frozenset[int] | None = None,
        poll_interval_s: float = ACL_POLL_INTERVAL_S,
    ) -> None:
        self.path = Path(path)
        self._stamp = _stamp(self.path)
        self.validator = AclValidator(load_acl_file(self.path), checked_codes=checked_codes,
                                      defer_body_bytes_min=DEFER_SIGNATURE_BODY_BYTES_MIN)
        self.poll_interval_s = poll_interval_s
        self._failed_stamp: _FileStamp | None = None
        self._task: asyncio.Task[None] | None = None
        log.info("ACL on: %d account(s), %d global white address pattern(s) from %s",
                 len(self.rules.accounts), len(self.rules.global_white), self.path)

    @property
    def rules(self) -> AclRules:
        """The rules in force."""
        return self.validator.rules

    def guard(self, request: RemotingCommand, connection: Any
              ) -> tuple[int, str] | PendingSignature | None:
        """The remoting request guard: ``RemotingServer.set_request_guard(service.guard)``;
        ``connection`` is anything with the peer's ``remote_address`` (``"ip:port"``). Large
        bodies' signatures come back as a ``PendingSignature`` for the worker thread
        (``tidemq.remoting.dispatch.DeferredCheck``)."""
        return self.validator.check(request, connection.remote_address)

    # -- hot reload ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start polling the file for changes (on the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> None:
        """Stop polling."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def reload_if_changed(self) -> bool:
        """Read the file again if it changed since it was last read.

        Returns:
            True when new rules were put in force. A file that does not load is logged
            (once per change) and the rules stay as they were.
        """
        stamp = _stamp(self.path)
        if stamp == self._stamp or stamp == self._failed_stamp:
            return False
        try:
            rules = load_acl_file(self.path)
        except AclFileError as exc:
            self._failed_stamp = stamp
            log.warning("ACL file changed but cannot be used; the previous rules stay in "
                        "force: %s", exc)
            return False
        self._stamp, self._failed_stamp = stamp, None
        self.validator.rules = rules
        log.info("ACL file %s reloaded: %d account(s), %d global white address pattern(s)",
                 self.path, len(rules.accounts), len(rules.global_white))
        return True

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            try:
                self.reload_if_changed()
            except Exception:  # never let the watcher die: the old rules stay in force
                log.exception("ACL file watch of %s failed; trying again", self.path)

    # -- changes by request --------------------------------------------------------------------

    def update_account(self, fields: Mapping[str, Any]) -> None:
        """Create the account ``fields["accessKey"]`` or change the fields given for it.

        ``topicPerms`` / ``groupPerms`` given replace the lists; fields not given keep their
        values (a new account gets RocketMQ's defaults).

        Raises:
            AclFileError: the account would not be valid, or the file cannot be written.
        """
        document = self._document()
        accounts = document.setdefault(ACCOUNTS, []) or []
        document[ACCOUNTS] = accounts
        access_key = fields.get("accessKey")
        existing = next((a for a in accounts if isinstance(a, dict)
                         and str(a.get("accessKey")) == str(access_key)), None)
        account = dict(existing) if existing is not None else {}
        for name in ACCOUNT_FIELDS:
            if fields.get(name) is not None:
                account[name] = fields[name]
        parse_account(account, f"account {access_key!r}")  # refuse before touching the file
        if existing is not None:
            accounts[accounts.index(existing)] = account
        else:
            accounts.append(account)
        self._write(document)

    def delete_account(self, access_key: str) -> bool:
        """Remove the account ``access_key``.

        Returns:
            False when there is no such account (nothing written).

        Raises:
            AclFileError: the file cannot be written.
        """
        document = self._document()
        accounts = document.get(ACCOUNTS) or []
        kept = [a for a in accounts
                if not (isinstance(a, dict) and str(a.get("accessKey")) == access_key)]
        if len(kept) == len(accounts):
            return False
        document[ACCOUNTS] = kept
        self._write(document)
        return True

    def update_global_white(self, patterns: Iterable[str]) -> None:
        """Replace ``globalWhiteRemoteAddresses`` with ``patterns``.

        Raises:
            AclFileError: a pattern does not parse, or the file cannot be written.
        """
        document = self._document()
        document[GLOBAL_WHITE] = [p.strip() for p in patterns if p.strip()]
        self._write(document)

    def _document(self) -> dict[str, Any]:
        # Start from the file as it is now (someone may have edited it since the last poll),
        # falling back on the rules in force when it does not load.
        self.reload_if_changed()
        return copy.deepcopy(dict(self.rules.document))

    def _write(self, document: dict[str, Any]) -> None:
        parse_acl_document(document, self.path)  # the same checks a reload will make
        write_acl_document(self.path, document)
        rules = parse_acl_document(document, self.path)
        self._stamp, self._failed_stamp = _stamp(self.path), None
        self.validator.rules = rules
        log.info("ACL file %s changed by request: %d account(s), dataVersion %d", self.path,
                 len(rules.accounts), rules.data_version_counter)
