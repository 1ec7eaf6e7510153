"""tidemq.remoting: the asyncio transport of the RocketMQ remoting protocol.

Servers and clients exchange ``RemotingCommand``s over TCP: requests matched to responses by
opaque, oneway requests, per-handler and per-connection bounds, timeouts and idle closing.
It knows nothing of messages; the broker, name server and client build on it.
"""

from tidemq.remoting.client import RemotingClient
from tidemq.remoting.connection import Connection, ConnectionEvent, ConnectionListener
from tidemq.remoting.dispatch import EncodedAnswers, Handler, LaterResponse, RequestDispatcher
from tidemq.remoting.errors import (
    RemotingClosed,
    RemotingConnectError,
    RemotingError,
    RemotingListenError,
    RemotingTimeout,
)
from tidemq.remoting.loop import install_event_loop_policy, new_event_loop
from tidemq.remoting.server import RemotingServer

__all__ = [
    "Connection",
    "ConnectionEvent",
    "ConnectionListener",
    "EncodedAnswers",
    "Handler",
    "LaterResponse",
    "RemotingClient",
    "RemotingClosed",
    "RemotingConnectError",
    "RemotingError",
    "RemotingListenError",
    "RemotingServer",
    "RemotingTimeout",
    "RequestDispatcher",
    "install_event_loop_policy",
    "new_event_loop",
]
