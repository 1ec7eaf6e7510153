"""The request signature of RocketMQ 4.x's plain ACL: what is signed, and how.

A client holding an access key and a secret key adds three extFields to every request it
sends (RocketMQ's ``AclClientRPCHook``, docs/protocol.md §14, docs/protocol.md "ACL"):

- ``AccessKey``: the account's access key;
- ``SecurityToken``: optional, sent and signed only when the client has one;
- ``Signature``: ``base64(HmacSHA1(secret key, content))`` where *content* is

    the values of every extField except ``Signature`` (the request's own header fields,
    ``AccessKey`` and ``SecurityToken`` included), taken in the order of their keys as
    Java's ``TreeMap<String, String>`` sorts them (UTF-16 code units), concatenated with no
    separator, UTF-8 encoded, followed by the raw body bytes when there is a body.

The server computes the same content from the request it received, minus the keys
``Signature`` and ``_UNIQUE_KEY_QUERY`` (a flag the Java client adds to QUERY_MESSAGE after
signing), and compares. The MAC key is the secret key's UTF-8 bytes; base64 is the standard
alphabet with padding (28 characters for SHA-1's 20 bytes).

This module only computes; who signs (the client) and who verifies (the broker's ACL) live
elsewhere, so both sides share one definition of the bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
# MixAll.UNIQUE_MSG_QUERY_FLAG: added by the Java client to QUERY_MESSAGE after it signed.
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"

_NOT_SIGNED_BY_SERVER = frozenset({SIGNATURE, UNIQUE_MSG_QUERY_FLAG})


def _java_order(key: str) -> bytes:
    # Java's String.compareTo orders by UTF-16 code unit, which big-endian UTF-16 bytes
    # compare in. For all-ASCII keys (every RocketMQ header field) Python's own order is the
    # same, and signed_head skips this.
    return key.encode("utf-16-be", "surrogatepass")


def signed_head(
    ext_fields: Mapping[str, str] | None, *, skip: frozenset[str] = frozenset({SIGNATURE})
) -> bytes:
    """The extField part of what a request's signature covers (module docstring); the
    body, when there is one, follows it (``Signer.sign``).

    Args:
        ext_fields: the request's extFields, AccessKey (and SecurityToken) already in.
        skip: keys left out; the client leaves out ``Signature``, the server also
            ``_UNIQUE_KEY_QUERY`` (``server_signed_head``).
    """
    if not ext_fields:
        return b""
    keys = [key for key in ext_fields if key not in skip]
    if "".join(keys).isascii():  # one C call, not one per key: this runs for every request
        keys.sort()
    else:
        keys.sort(key=_java_order)
    return "".join([ext_fields[key] for key in keys]).encode("utf-8", "surrogatepass")


def server_signed_head(ext_fields: Mapping[str, str] | None) -> bytes:
    """What the server checks the signature against, before the body: ``signed_head``
    without ``Signature`` and ``_UNIQUE_KEY_QUERY`` (RocketMQ's ``PlainAccessValidator``)."""
    return signed_head(ext_fields, skip=_NOT_SIGNED_BY_SERVER)


class Signer:
    """Computes signatures with one secret key (the HMAC key is set up once, then copied).

    Args:
        secret_key: the account's secret key (its UTF-8 bytes are the HMAC-SHA1 key).
    """

    __slots__ = ("_mac",)

    def __init__(self, secret_key: str) -> None:
        self._mac = hmac.new(secret_key.encode("utf-8", "surrogatepass"), digestmod=hashlib.sha1)

    def sign(self, head: bytes, body: bytes | bytearray | memoryview | None = None) -> str:
        """``base64(HmacSHA1(secret key, head + body))`` as text (28 characters); the body
        is fed to the MAC as it is, never copied."""
        mac = self._mac.copy()
        mac.update(head)
        if body:
            mac.update(body)
        return base64.b64encode(mac.digest()).decode("ascii")


def signature_matches(expected: str, given: str | None) -> bool:
    """Compare two signatures in constant time; a missing one never matches."""
    if given is None:
        return False
    return hmac.compare_digest(expected.encode("ascii"), given.encode("utf-8", "surrogatepass"))


def sign_ext_fields(
    ext_fields: dict[str, str],
    body: bytes | bytearray | memoryview | None,
    access_key: str,
    signer: Signer,
    security_token: str | None = None,
) -> None:
    """Add AccessKey, SecurityToken (when given) and Signature to ``ext_fields`` in place,
    exactly as RocketMQ's ``AclClientRPCHook`` does."""
    ext_fields[ACCESS_KEY] = access_key
    if security_token is not None:
        ext_fields[SECURITY_TOKEN] = security_token
    ext_fields.pop(SIGNATURE, None)
    ext_fields[SIGNATURE] = signer.sign(signed_head(ext_fields), body)
