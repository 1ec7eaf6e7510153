"""``plain_acl.yml``: RocketMQ's plain-ACL file, read into accounts and written back.

The file (YAML, as RocketMQ ships it in ``conf/plain_acl.yml``)::

    globalWhiteRemoteAddresses:        # peers that skip every check
      - 10.10.103.*
    accounts:
      - accessKey: RocketMQ            # more than 6 characters
        secretKey: 12345678            # more than 6 characters
        whiteRemoteAddress:            # optional: peers of this account skip the signature
        admin: false                   # true: may send the admin request codes
        defaultTopicPerm: DENY         # topics not listed below
        defaultGroupPerm: SUB          # groups not listed below
        topicPerms: [topicA=DENY, topicB=PUB|SUB]
        groupPerms: [groupA=DENY, groupB=PUB|SUB]
    dataVersion:                       # written by the broker when it changes the file
      - counter: 1
        timestamp: 1700000000000

A missing default permission is DENY (as in RocketMQ). Unlike RocketMQ, which maps an unknown
permission word to DENY without a word and skips nothing, a file with a problem (a permission
word that is not one, an address pattern that does not parse, a key too short, one access key
twice) is refused as a whole with an ``AclFileError`` naming the file, the account and the
value: the broker keeps the accounts it had (``AclService``), so a typo never opens or shuts
a door silently.

YAML is read with ``yaml.safe_load`` (no object construction). Writing (the ACL admin
requests) goes through ``write_acl_document``: a new file beside the old one, fsync, rename,
so a crash leaves the old file or the new one, never half of one. Comments do not survive a
write (RocketMQ loses them too).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tidemq.acl.address import AddressPattern
from tidemq.acl.permission import PERM_WORDS, Perm, parse_perm
from tidemq.acl.resources import retry_topic
from tidemq.errors import ConfigError
from tidemq.protocol.signature import Signer

# RocketMQ's AclConstants.ACCESS_KEY_MIN_LENGTH / SECRET_KEY_MIN_LENGTH: keys must be longer.
KEY_LENGTH_MIN_EXCLUSIVE = 6

# A hand-edited ACL file of many thousand accounts is already unusual; a file far larger is
# a mistake (a log pasted in), refused before YAML builds it in memory.
ACL_FILE_BYTES_MAX = 16 * 1024 * 1024

ACL_FILE_NAME = "plain_acl.yml"
GLOBAL_WHITE = "globalWhiteRemoteAddresses"
ACCOUNTS = "accounts"
DATA_VERSION = "dataVersion"


class AclFileError(ConfigError):
    """``plain_acl.yml`` cannot be read or holds something that is not a valid rule."""


@dataclass(frozen=True, slots=True)
class Account:
    """One account of the file, ready for checks.

    ``resource_perms`` holds topics by name and groups as ``%RETRY%<group>`` (RocketMQ's
    single resource map).
    """

    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: AddressPattern
    admin: bool
    default_topic_perm: Perm
    default_group_perm: Perm
    resource_perms: Mapping[str, Perm]
    signer: Signer = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class AclRules:
    """Everything one ``plain_acl.yml`` says, parsed; ``document`` is the YAML as read."""

    path: Path
    accounts: Mapping[str, Account]
    global_white: tuple[AddressPattern, ...]
    data_version_counter: int
    data_version_timestamp: int
    document: Mapping[str, Any]


def default_acl_file(config_file: Path | None = None) -> Path:
    """Where the ACL file is when aclFilePath is not set: ``$ROCKETMQ_HOME/conf/plain_acl.yml``
    as RocketMQ has it, else beside the server's config file, else ``conf/plain_acl.yml``
    under the working directory."""
    home = os.environ.get("ROCKETMQ_HOME")
    if home:
        return Path(home) / "conf" / ACL_FILE_NAME
    if config_file is not None:
        return Path(config_file).resolve().parent / ACL_FILE_NAME
    return Path("conf") / ACL_FILE_NAME


def acl_file_of(acl_file_path: str | None, config_file: Path | None = None) -> Path:
    """The ACL file a server uses: aclFilePath when set, else ``default_acl_file``."""
    return Path(acl_file_path) if acl_file_path else default_acl_file(config_file)


def read_acl_document(path: Path) -> dict[str, Any]:
    """The YAML document of ``path`` (an empty file is an empty document).

    Raises:
        AclFileError: the file is missing, too large, not YAML, or not a mapping at the top.
    """
    try:
        size = path.stat().st_size
        if size > ACL_FILE_BYTES_MAX:
            raise AclFileError(
                f"ACL file {path} is {size} bytes, more than {ACL_FILE_BYTES_MAX}; is it the "
                "right file?"
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AclFileError(
            f"ACL file {path} does not exist (create it, or point aclFilePath at it)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AclFileError(f"cannot read ACL file {path}: {exc}") from exc
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AclFileError(f"ACL file {path} is not valid YAML: {exc}") from exc
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise AclFileError(
            f"ACL file {path} holds a {type(document).__name__} at the top; expected keys "
            f"{GLOBAL_WHITE} and {ACCOUNTS}"
        )
    return document


def load_acl_file(path: Path) -> AclRules:
    """Read and check ``path`` (module docstring).

    Raises:
        AclFileError: anything wrong, with the file, the account and the value named.
    """
    return parse_acl_document(read_acl_document(path), path)


def parse_acl_document(document: Mapping[str, Any], path: Path) -> AclRules:
    """Check a YAML document of ``path`` and build its rules.

    Raises:
        AclFileError: anything wrong (module docstring).
    """
    white = _list_of_text(document.get(GLOBAL_WHITE), f"{path}: {GLOBAL_WHITE}")
    global_white = tuple(_pattern(text, f"{path}: {GLOBAL_WHITE}") for text in white)
    accounts: dict[str, Account] = {}
    raw_accounts = document.get(ACCOUNTS) or []
    if not isinstance(raw_accounts, list):
        raise AclFileError(f"{path}: {ACCOUNTS} must be a list of accounts")
    for index, raw in enumerate(raw_accounts):
        account = parse_account(raw, f"{path}: account #{index + 1}")
        if account.access_key in accounts:
            raise AclFileError(
                f"{path}: accessKey {account.access_key!r} is defined twice; keep one"
            )
        accounts[account.access_key] = account
    counter, timestamp = _data_version(document.get(DATA_VERSION), path)
    return AclRules(path, accounts, global_white, counter, timestamp, dict(document))


def parse_account(raw: Any, where: str) -> Account:
    """One account mapping of the file (or of an UPDATE_AND_CREATE_ACL_CONFIG request).

    Raises:
        AclFileError: a key missing or too short, a permission or address that is not one.
    """
    if not isinstance(raw, dict):
        raise AclFileError(f"{where} is not a mapping of accessKey, secretKey, ...")
    access_key = _key_text(raw.get("accessKey"), "accessKey", where)
    where = f"{where} (accessKey {access_key})"
    secret_key = _key_text(raw.get("secretKey"), "secretKey", where)
    admin = raw.get("admin", False)
    if isinstance(admin, str):
        admin = admin.strip().lower() == "true"
    if not isinstance(admin, bool):
        raise AclFileError(f"{where}: admin must be true or false, not {admin!r}")
    white = raw.get("whiteRemoteAddress")
    resource_perms: dict[str, Perm] = {}
    for key, as_resource in (("topicPerms", str), ("groupPerms", retry_topic)):
        for entry in _list_of_text(raw.get(key), f"{where}: {key}"):
            name, sep, word = entry.partition("=")
            perm = parse_perm(word) if sep else None
            if not name.strip() or perm is None:
                raise AclFileError(
                    f"{where}: {key} entry {entry!r} is not name=PERM with PERM one of "
                    f"{PERM_WORDS}"
                )
            resource_perms[as_resource(name.strip())] = perm
    return Account(
        access_key=access_key,
        secret_key=secret_key,
        white_remote_address=_pattern(
            "" if white is None else str(white), f"{where}: whiteRemoteAddress"
        ),
        admin=admin,
        default_topic_perm=_default_perm(raw.get("defaultTopicPerm"), "defaultTopicPerm", where),
        default_group_perm=_default_perm(raw.get("defaultGroupPerm"), "defaultGroupPerm", where),
        resource_perms=resource_perms,
        signer=Signer(secret_key),
    )


def write_acl_document(path: Path, document: dict[str, Any]) -> tuple[int, int]:
    """Write ``document`` to ``path`` atomically with its dataVersion moved on.

    Returns:
        The new ``(counter, timestamp)`` of its dataVersion.

    Raises:
        AclFileError: the file cannot be written (the old one is left as it was).
    """
    counter, _ = _data_version(document.get(DATA_VERSION), path)
    counter += 1
    timestamp = int(time.time() * 1000)
    document[DATA_VERSION] = [{"counter": counter, "timestamp": timestamp}]
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=False,
                          allow_unicode=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise AclFileError(f"cannot write ACL file {path}: {exc.strerror or exc}") from exc
    return counter, timestamp


def _key_text(value: Any, name: str, where: str) -> str:
    if value is None or isinstance(value, bool | dict | list):
        raise AclFileError(f"{where}: {name} is missing")
    text = str(value)
    if len(text) <= KEY_LENGTH_MIN_EXCLUSIVE:
        raise AclFileError(
            f"{where}: {name} must be longer than {KEY_LENGTH_MIN_EXCLUSIVE} characters "
            "(RocketMQ's rule)"
        )
    return text


def _default_perm(value: Any, name: str, where: str) -> Perm:
    if value is None:
        return Perm.DENY
    perm = parse_perm(value)
    if perm is None:
        raise AclFileError(f"{where}: {name}={value!r} is not one of {PERM_WORDS}")
    return perm


def _pattern(text: str, where: str) -> AddressPattern:
    try:
        return AddressPattern.parse(text)
    except ValueError as exc:
        raise AclFileError(f"{where}: {exc}") from None


def _list_of_text(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):  # one entry written without the list dash
        return [value]
    if not isinstance(value, list):
        raise AclFileError(f"{where} must be a list")
    return [str(item) for item in value if item is not None]


def _data_version(value: Any, path: Path) -> tuple[int, int]:
    entry = value[0] if isinstance(value, list) and value else value
    if not entry:
        return 0, 0
    if not isinstance(entry, dict):
        raise AclFileError(f"{path}: {DATA_VERSION} must hold counter and timestamp")
    try:
        return int(entry.get("counter", 0)), int(entry.get("timestamp", 0))
    except (TypeError, ValueError):
        raise AclFileError(f"{path}: {DATA_VERSION} counter and timestamp must be numbers"
                           ) from None
