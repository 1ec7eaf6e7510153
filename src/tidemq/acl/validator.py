"""The ACL check of one request, in RocketMQ's order (``PlainPermissionManager.validate``).

1. The peer's IP matches ``globalWhiteRemoteAddresses``: allowed, nothing else checked.
2. The request carries an ``AccessKey`` extField naming an account; else refused.
3. The peer matches the account's ``whiteRemoteAddress``: allowed.
4. The ``Signature`` extField equals ``base64(HmacSHA1(secretKey, content))`` (content:
   ``tidemq.protocol.signature``); else refused.
5. An admin-only code (``ADMIN_CODES``) needs ``admin: true``.
6. PUB on ``RMQ_SYS_TRACE_TOPIC`` is always allowed (message trace); otherwise every
   resource the request touches (``resources.needed_permissions``) needs its permission:
   the one listed for it in topicPerms / groupPerms, else the account's default for topics
   or groups. An admin account without any listed resource is allowed everything.

With ``defer_body_bytes_min`` set (the servers set it), a request whose body is at least
that long gets steps 5 and 6 decided at once and step 4 (the HMAC over the body, the costly
part) handed back as a ``PendingSignature`` for the remoting layer to run in a worker
thread; the outcome is the same as checking in order (a bad signature wins).

A refusal is ``(NO_PERMISSION, remark)``; the remark names the access key, the request code,
the resource and the permission missing, and what to change. (RocketMQ answers SYSTEM_ERROR
with its exception text; NO_PERMISSION lets a client tell a refusal from a broken broker, and
RocketMQ's Java producer retries both alike.) A request the check cannot read (a heartbeat
body that is not JSON) is refused the same way, never let through.
"""

from __future__ import annotations

import ipaddress

from tidemq.acl.acl_file import Account, AclRules
from tidemq.acl.address import peer_ip
from tidemq.acl.permission import ADMIN_CODES, Perm, perm_allows, perm_text
from tidemq.acl.resources import UnreadableRequest, is_group_resource, needed_permissions
from tidemq.protocol.codes import ResponseCode, request_code_name
from tidemq.protocol.command import RemotingCommand
from tidemq.protocol.signature import ACCESS_KEY, SIGNATURE, server_signed_head, signature_matches

# RocketMQ's TopicValidator.RMQ_SYS_TRACE_TOPIC: every client may publish traces.
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"

# Where the hop to a worker thread pays. It costs 35-85 us of CPU per request (the
# executor's queue and locks, a futex wake of the worker, the loop's self-pipe wake-up for
# the result), as much as SHA-1 over a 64 x 1 KiB batch (about 40 us): deferring those
# doubled the broker's ACL cost per batch, and on a machine with no idle core the thread's
# parallelism buys nothing back (benchmarks/RESULTS.md, issue 14, "aclcost"). From 1 MiB on
# (about 550 us of hashing, which hashlib does without the GIL) the hop adds under 10 % and
# keeps the loop answering other connections meanwhile; smaller bodies are hashed inline.
DEFER_SIGNATURE_BODY_BYTES_MIN = 1024 * 1024

# Peers' parsed IPs are remembered by their "ip:port" text; past this many the memo starts
# over (a broker has a few thousand connections at most; a scan must not grow it for ever).
PEER_MEMO_MAX = 4096

Refusal = tuple[int, str]
IP = ipaddress.IPv4Address | ipaddress.IPv6Address | None


class AclValidator:
    """Checks requests against the rules in force; ``rules`` is replaced on reload.

    Args:
        rules: the parsed ACL file.
        checked_codes: check only these request codes and let every other through (the
            name server checks its write operations only); None checks every request.
    """

    def __init__(self, rules: AclRules, *, checked_codes: frozenset[int] | None = None,
                 defer_body_bytes_min: int | None = None) -> None:
        self.rules = rules
        self._checked_codes = checked_codes
        self._defer_body_bytes_min = defer_body_bytes_min
        self._peer_ips: dict[str, IP] = {}

    def check(self, request: RemotingCommand, remote_address: str
              ) -> Refusal | PendingSignature | None:
        """None when ``request`` from ``remote_address`` (``"ip:port"``) may proceed, else
        ``(response code, remark)``, or a ``PendingSignature`` whose ``decide()`` says which
        (module docstring)."""
        if self._checked_codes is not None and request.code not in self._checked_codes:
            return None
        rules = self.rules  # one snapshot for the whole check, whatever a reload does
        ip = self._peer_ip(remote_address)
        for pattern in rules.global_white:
            if pattern.matches(ip):
                return None
        fields = request.ext_fields
        access_key = fields.get(ACCESS_KEY) if fields else None
        if access_key is None:
            return _refuse(
                f"the request ({_code(request)}) is not signed: it has no AccessKey. Give the "
                "client an access key and secret key of an account in the broker's ACL "
                f"file, or add {_ip_text(ip, remote_address)} to globalWhiteRemoteAddresses"
            )
        account = rules.accounts.get(access_key)
        if account is None:
            return _refuse(
                f"AccessKey {access_key!r} is not an account of this broker's ACL file "
                f"({_code(request)}); check the client's access key"
            )
        if account.white_remote_address.matches(ip):
            return None
        body = request.body
        if (self._defer_body_bytes_min is not None and body is not None
                and len(body) >= self._defer_body_bytes_min):
            return PendingSignature(request, account, self._check_permissions(request, account))
        refusal = _signature_refusal(request, account)
        if refusal is not None:
            return refusal
        return self._check_permissions(request, account)

    def _check_permissions(self, request: RemotingCommand, account: Account) -> Refusal | None:
        if request.code in ADMIN_CODES and not account.admin:
            return _refuse(
                f"{_code(request)} needs an admin account; AccessKey {account.access_key!r} is "
                "not admin (set admin: true for it, or use an admin account)"
            )
        try:
            needs = needed_permissions(request)
        except UnreadableRequest as exc:
            return _refuse(f"{_code(request)} cannot be checked: {exc}")
        if not needs:
            return None
        if len(needs) == 1 and needs[0] == (TRACE_TOPIC, Perm.PUB):
            return None
        owned_map = account.resource_perms
        if not owned_map and account.admin:
            return None
        for resource, needed in needs:
            owned = owned_map.get(resource)
            is_group = is_group_resource(resource)
            source = "listed for it"
            if owned is None:
                owned = account.default_group_perm if is_group else account.default_topic_perm
                source = f"its {'defaultGroupPerm' if is_group else 'defaultTopicPerm'}"
            if not perm_allows(needed, owned):
                kind, name = ("group", resource[len("%RETRY%"):]) if is_group else ("topic",
                                                                                   resource)
                return _refuse(
                    f"AccessKey {account.access_key!r} has no {perm_text(needed)} permission "
                    f"on {kind} {name!r} ({_code(request)}); the account has "
                    f"{perm_text(owned)} ({source}). Grant it in "
                    f"{'groupPerms' if is_group else 'topicPerms'} of the ACL file"
                )
        return None

    def _peer_ip(self, remote_address: str) -> IP:
        try:
            return self._peer_ips[remote_address]
        except KeyError:
            pass
        if len(self._peer_ips) >= PEER_MEMO_MAX:
            self._peer_ips.clear()
        ip = self._peer_ips[remote_address] = peer_ip(remote_address)
        return ip


class PendingSignature:
    """The signature check of one request, to run off the event loop; ``decide()`` gives
    the check's outcome: the signature refusal, else ``then`` (the permission verdict made
    already). Thread-safe: it reads the request and the account, both left unchanged."""

    __slots__ = ("_account", "_request", "then")

    def __init__(self, request: RemotingCommand, account: Account, then: Refusal | None
                 ) -> None:
        self._request = request
        self._account = account
        self.then = then

    def decide(self) -> Refusal | None:
        """The refusal, or None when the request may proceed."""
        refusal = _signature_refusal(self._request, self._account)
        return refusal if refusal is not None else self.then


def _signature_refusal(request: RemotingCommand, account: Account) -> Refusal | None:
    fields = request.ext_fields or {}
    given = fields.get(SIGNATURE)
    expected = account.signer.sign(server_signed_head(fields), request.body)
    if signature_matches(expected, given):
        return None
    what = "has no Signature" if given is None else "has a Signature that does not match"
    return _refuse(
        f"the request ({_code(request)}) with AccessKey {account.access_key!r} {what}: the "
        "client's secret key differs from the account's, or the request was changed on the way"
    )


def _refuse(remark: str) -> Refusal:
    return ResponseCode.NO_PERMISSION, f"[ACL] {remark}"


def _code(request: RemotingCommand) -> str:
    name = request_code_name(request.code)
    return name if name.startswith("code ") else f"{name}, code {request.code}"


def _ip_text(ip: IP, remote_address: str) -> str:
    return str(ip) if ip is not None else remote_address

