"""Errors of the remoting transport, raised to whoever sent a request.

All are ``ClientError`` subclasses with ``retriable=True``: the request may not have reached
the peer (connect failed, connection closed) or its answer is late (timeout), so sending it
again, to the same address or another, may succeed. Callers that must not duplicate a
non-idempotent request decide for themselves, as RocketMQ's producer does for sends.

``RemotingListenError`` is the one server-side error: a port that cannot be bound is a
configuration problem (``ConfigError``), found at start.
"""

from __future__ import annotations

from tidemq.errors import ClientError, ConfigError


class RemotingError(ClientError):
    """The transport could not carry a request or its response."""

    retriable = True


class RemotingConnectError(RemotingError):
    """No connection could be opened to the address (refused, unreachable or timed out)."""


class RemotingTimeout(RemotingError):
    """No response arrived within the request's timeout; the connection stays open."""


class RemotingClosed(RemotingError):
    """The connection closed before the request was sent or its response arrived."""


class RemotingListenError(ConfigError):
    """A server could not listen on a configured host and port (in use, not permitted)."""
