"""Permissions of RocketMQ's plain ACL: the four bits, their text forms, and which request
codes need an admin account.

Bits and text (RocketMQ's ``Permission``): ``DENY`` 1, ``ANY`` 2 (needed by nothing we check),
``PUB`` 4, ``SUB`` 8; the file writes ``DENY``, ``PUB``, ``SUB``, ``PUB|SUB`` or ``SUB|PUB``.
An owned permission with the DENY bit allows nothing; otherwise a needed bit must be owned.
"""

from __future__ import annotations

import enum

from tidemq.protocol.codes import RequestCode


class Perm(enum.IntFlag):
    """A permission on a topic or a group (RocketMQ's byte values)."""

    NONE = 0
    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


_PERM_BY_TEXT = {
    "DENY": Perm.DENY,
    "PUB": Perm.PUB,
    "SUB": Perm.SUB,
    "PUB|SUB": Perm.PUB | Perm.SUB,
    "SUB|PUB": Perm.PUB | Perm.SUB,
}
PERM_WORDS = "DENY, PUB, SUB, PUB|SUB or SUB|PUB"


def parse_perm(text: object) -> Perm | None:
    """The permission a file's text names, or None when it names none (a typo)."""
    if not isinstance(text, str):
        return None
    return _PERM_BY_TEXT.get(text.strip().upper())


def perm_text(perm: Perm) -> str:
    """How the file writes ``perm``: ``DENY``, ``PUB``, ``SUB`` or ``PUB|SUB``."""
    if perm & Perm.DENY or not perm & (Perm.PUB | Perm.SUB):
        return "DENY"
    if perm & Perm.PUB and perm & Perm.SUB:
        return "PUB|SUB"
    return "PUB" if perm & Perm.PUB else "SUB"


def perm_allows(needed: Perm, owned: Perm) -> bool:
    """True when ``owned`` grants ``needed`` (RocketMQ's ``Permission.checkPermission``)."""
    if owned & Perm.DENY:
        return False
    if needed & Perm.ANY:
        return bool(owned & (Perm.PUB | Perm.SUB))
    return bool(needed & owned)


# Request codes only an account with ``admin: true`` may send. RocketMQ 4.x lists the first
# five; tidemq adds what changes other people's data or the access rules themselves: offset
# resets, the ACL administration codes (GET_BROKER_CLUSTER_ACL_CONFIG returns secret keys),
# store cleaning, and the name server's write operations (RocketMQ leaves the name server
# open; a tidemq name server with aclEnable checks these).
ADMIN_CODES = frozenset({
    RequestCode.UPDATE_AND_CREATE_TOPIC,
    RequestCode.UPDATE_BROKER_CONFIG,
    RequestCode.DELETE_TOPIC_IN_BROKER,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    RequestCode.DELETE_SUBSCRIPTIONGROUP,
    # tidemq's additions
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
    RequestCode.RESET_CONSUMER_OFFSET_IN_BROKER,
    RequestCode.CLONE_GROUP_OFFSET,
    RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
    RequestCode.DELETE_ACL_CONFIG,
    RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
    RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG,
    RequestCode.CLEAN_EXPIRED_CONSUMEQUEUE,
    RequestCode.CLEAN_UNUSED_TOPIC,
    RequestCode.DELETE_EXPIRED_COMMITLOG,
    RequestCode.TRIGGER_DELETE_FILES,
    RequestCode.PUT_KV_CONFIG,
    RequestCode.DELETE_KV_CONFIG,
    RequestCode.DELETE_TOPIC_IN_NAMESRV,
    RequestCode.UPDATE_NAMESRV_CONFIG,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER,
    RequestCode.ADD_WRITE_PERM_OF_BROKER,
    RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
})

# The name server checks only these (its reads stay open to everyone, as in RocketMQ, so
# clients without credentials still find routes).
NAMESRV_CHECKED_CODES = frozenset({
    RequestCode.PUT_KV_CONFIG,
    RequestCode.DELETE_KV_CONFIG,
    RequestCode.DELETE_TOPIC_IN_NAMESRV,
    RequestCode.UPDATE_NAMESRV_CONFIG,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER,
    RequestCode.ADD_WRITE_PERM_OF_BROKER,
    RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
})
