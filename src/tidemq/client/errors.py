"""Errors the client raises, typed by what the caller can do about them.

All are ``ClientError`` subclasses (``tidemq.errors``) carrying ``retriable``:

- ``BrokerRejected``: a broker or name server answered with a response code other than
  success. ``code`` and ``remark`` are the broker's; ``retriable`` is True for the codes a
  RocketMQ producer retries on another broker (docs/protocol.md §1.5) and for SYSTEM_BUSY
  (the broker was overloaded; later may work).
- ``NoRouteError``: no name server knows the topic (and auto-creation is not possible).
- ``NameServerUnavailable``: none of the configured name servers answered.
- ``ClientStateError``: a call that needs a started client was made before ``start()`` or after
  ``close()``.
- ``InvalidMessage``: a message fails a client-side check (empty body, delay in a batch, mixed
  topics in a batch) before anything was sent. ``MessageTooLarge`` and ``InvalidTopicName``
  (from ``tidemq.errors``) cover sizes and names.

Transport failures (``RemotingTimeout``, ``RemotingConnectError``, ``RemotingClosed``) come from
``tidemq.remoting.errors`` unchanged: they are retriable.
"""

from __future__ import annotations

from tidemq.errors import ClientError
from tidemq.protocol.codes import ResponseCode, response_code_name

# Response codes after which the Java 4.9 producer retries a send on another queue/broker
# (DefaultMQProducer.retryResponseCodes).
SEND_RETRY_CODES = frozenset(
    {
        ResponseCode.TOPIC_NOT_EXIST,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.NO_PERMISSION,
        ResponseCode.NO_BUYER_ID,
        ResponseCode.NOT_IN_CURRENT_UNIT,
    }
)


class BrokerRejected(ClientError):
    """A broker or name server answered a request with an error response code.

    Attributes:
        code: the response code (``ResponseCode`` value).
        remark: the server's explanation, possibly empty.
        address: the server that answered, "ip:port".
        retriable: True when sending again (elsewhere, or later) may succeed.
    """

    def __init__(
        self,
        what: str,
        code: int,
        remark: str | None,
        address: str,
        *,
        retriable: bool | None = None,
    ):
        self.remark = remark or ""
        self.address = address
        if retriable is None:
            retriable = code in SEND_RETRY_CODES or code == ResponseCode.SYSTEM_BUSY
        super().__init__(
            f"{what} failed at {address}: {response_code_name(code)} ({code})"
            + (f": {self.remark}" if self.remark else ""),
            code=code,
            retriable=retriable,
        )


class NoRouteError(ClientError):
    """No name server has a route for the topic, and it cannot be auto-created."""


class NameServerUnavailable(ClientError):
    """No configured name server answered; they may be down or the addresses wrong."""

    retriable = True


class ClientStateError(ClientError):
    """The client is not started, or already closed."""


class InvalidMessage(ClientError):
    """A message fails a client-side check; nothing was sent."""


class InvalidSubscription(ClientError):
    """A subscription expression or queue assignment cannot be used."""
