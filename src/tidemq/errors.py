"""The tidemq error hierarchy: few types, sorted by who must act.

- ``ProtocolError``: bytes on the wire break the remoting protocol. ``RemoteProtocolError``
  means the peer sent them (close that connection); ``LocalProtocolError`` means we were
  asked to send something the protocol cannot carry (a bug or a bad argument here).
- ``StoreError``: the message store cannot do what was asked (``CorruptRecord``,
  ``StoreFull``, ``StoreLocked``, ``ConfigFileCorrupt``).
- ``ClientError``: a client call failed; ``retriable`` says whether trying again may help.

Every message names the value, the limit or expectation, and the setting to change.
"""

from __future__ import annotations


class TidemqError(Exception):
    """Base of every error tidemq raises on purpose."""


class ProtocolError(TidemqError):
    """Bytes that break the RocketMQ remoting protocol or a message format."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the protocol; the connection must be closed."""


class LocalProtocolError(ProtocolError):
    """We were asked to encode something the protocol cannot carry."""


class FrameTooLarge(RemoteProtocolError):
    """A frame's length prefix is above ``frame_size_max``."""


class HeaderFieldError(RemoteProtocolError):
    """A command's extFields lack a required header field or hold one that does not parse.

    ``field`` is the extField key as sent, ``value`` the raw string (None when missing).
    """

    def __init__(self, message: str, *, field: str, value: str | None = None):
        super().__init__(message)
        self.field = field
        self.value = value


class InvalidMessageId(RemoteProtocolError):
    """A message id is not a well-formed offset message id (32 or 56 hex characters)."""


class StoreError(TidemqError):
    """The message store cannot do what was asked."""


class CorruptRecord(StoreError):
    """A stored record fails its magic, size or CRC check."""


class StoreFull(StoreError):
    """The disk holding the store has no room for the write."""


class StoreLocked(StoreError):
    """Another process holds the store directory's lock file."""


class ConfigFileCorrupt(StoreError):
    """A config file and its ``.bak`` copy are both unreadable."""


class ConfigError(TidemqError):
    """A configuration key or value is unknown or invalid."""


class ClientError(TidemqError):
    """A client call failed. ``retriable`` says whether the same call may succeed later."""

    retriable: bool = False

    def __init__(self, message: str, *, code: int | None = None, retriable: bool | None = None):
        super().__init__(message)
        self.code = code
        if retriable is not None:
            self.retriable = retriable


class MessageTooLarge(ClientError):
    """A message body or its properties exceed the configured limit."""


class InvalidTopicName(ClientError):
    """A topic name breaks RocketMQ's topic name rules."""


class SqlFilterError(TidemqError):
    """A SQL92 property filter expression does not parse, breaks a limit, or is illegal
    (e.g. ``a > 'x'``).

    ``position`` is the 0-based character offset in ``expression`` where the problem was
    found (its length for "ended too early"); ``expected`` says what would have been
    accepted there, when that is what went wrong.
    """

    def __init__(
        self, message: str, *, expression: str, position: int, expected: str | None = None
    ):
        super().__init__(message)
        self.expression = expression
        self.position = position
        self.expected = expected
