"""Parked pulls: a drained queue's long-polling pull whose answer is taken in the read callback.

Theory of operation
-------------------
A consumer keeping up with its producers spends its time waiting at the end of its queues:
one pull per queue parked at the broker (long polling), answered when a message arrives,
followed at once by the next pull. Awaited in a task, each answer went through a chain of
coroutines (the consumer's loop, read routing, the broker call, the client, the connection)
and a loop iteration of its own before the consumer saw it; a PullConsumer's ``poll`` took a
third. At 2,000 msg/s that fixed cost per answer is most of a consumer's CPU, and every
microsecond of it is taken from the broker and the producer sharing the machine's cores.

So in the steady state the consumers hand the pull to ``Connection.request_nowait`` with a
``ParkedPull`` as its receiver: the connection calls the consumer back from its read
callback, in the loop iteration that read the answer, and the consumer takes the messages
and parks the next pull from there. Only the simple case goes this way: the queue's broker
group has one address (a master alone), a connection to it is open, and its write buffer
takes the request now (``parking_connection``). Anything else -- choosing among a master and
its slaves, connecting, waiting for the write buffer, backing off after an error, flow
control -- stays in the consumer's task, which takes over whenever a parked pull's answer
is not the simple case or its request failed.

A parked pull carries the consumer's epoch of its queue (a seek, a release or a rebalance
moves it on), so an answer that arrives for a queue the consumer has moved on from is
dropped, as a cancelled task's answer is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from tidemq.client.broker_api import PULL_MESSAGE_CODE
from tidemq.protocol.command import RemotingCommand, next_opaque

if TYPE_CHECKING:
    from tidemq.client.instance import ClientInstance
    from tidemq.client.message import MessageQueue
    from tidemq.client.subscription import Subscription
    from tidemq.remoting.connection import Connection


class ParkedPullHandler(Protocol):
    """What a consumer implements to take its parked pulls' outcomes. Both are called from
    a connection's callbacks: they must not raise."""

    def parked_answered(self, parked: ParkedPull, response: RemotingCommand) -> None: ...

    def parked_failed(self, parked: ParkedPull, error: BaseException) -> None: ...


class ParkedPull:
    """One parked pull, the receiver of its answer (``Connection.request_nowait``).

    Attributes:
        owner: the consumer's record of the queue (its queue state or ProcessQueue).
        epoch: the owner's epoch when the pull was sent.
        offset: the queue offset pulled.
        address: the broker address it went to.
        subscription: the subscription it carried (the answer is filtered by it).
    """

    __slots__ = ("address", "epoch", "finished", "handler", "offset", "owner", "subscription")

    def __init__(self, handler: ParkedPullHandler, owner: Any, epoch: int, offset: int,
                 address: str, subscription: Subscription) -> None:
        self.handler = handler
        self.owner = owner
        self.epoch = epoch
        self.offset = offset
        self.address = address
        self.subscription = subscription
        self.finished = False

    def done(self) -> bool:
        """True once the answer or the failure was handed over."""
        return self.finished

    def set_result(self, response: RemotingCommand) -> None:
        """The broker answered (any code)."""
        self.finished = True
        self.handler.parked_answered(self, response)

    def set_exception(self, error: BaseException) -> None:
        """The pull timed out, or its connection closed first."""
        self.finished = True
        self.handler.parked_failed(self, error)


def parking_connection(instance: ClientInstance,
                       queue: MessageQueue) -> tuple[int, str, Connection] | None:
    """``(broker id, address, open connection)`` when ``queue``'s broker group has exactly
    one address and a connection to it is open; None otherwise (the task's path then)."""
    addresses = instance.broker_addresses.get(queue.broker_name)
    if not addresses or len(addresses) != 1:
        return None
    ((broker_id, address),) = addresses.items()
    connection = instance.remoting.open_connection(address)
    if connection is None:
        return None
    return broker_id, address, connection


def send_parked_pull(connection: Connection, pull: RemotingCommand | dict[str, str],
                     timeout_ms: int, parked: ParkedPull) -> bool:
    """Send a PULL_MESSAGE (a request, e.g. rendered by a ``PullRequestTemplate``, or its
    extFields: the request's own dict) whose outcome goes to ``parked``; False, with nothing
    sent, when the connection cannot take it without waiting.

    Raises:
        LocalProtocolError: the request cannot be encoded; nothing was sent.
    """
    request = (pull if isinstance(pull, RemotingCommand)
               else RemotingCommand(PULL_MESSAGE_CODE, next_opaque(), 0, None, pull))
    return connection.request_nowait(request, timeout_ms, parked)
