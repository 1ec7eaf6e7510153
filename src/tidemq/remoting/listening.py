"""``listen``: one listening port in a ``ServerTls`` mode, for any asyncio protocol.

The remoting port and the broker's HA port both serve the broker's TLS mode
(``tidemq.remoting.tls``): ``disabled`` plain TCP, ``enforcing`` TLS only (a plain peer fails
the handshake and is closed before its protocol sees a byte), ``permissive`` both on one
port, told apart by the first byte (``SniffingListener``). Neither protocol starts a TLS
record's 0x16: a remoting frame starts with the top byte of its length (0x00 under 16 MiB),
an HA offset report with the top byte of an offset (0x00 below 2^56).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from tidemq.remoting.sniffing_listener import SniffingListener
from tidemq.remoting.tls import TLS_HANDSHAKE_TIMEOUT_S, ServerTls, TlsMode

# RocketMQ's serverSocketBacklog default.
LISTEN_BACKLOG = 1024

Listener = asyncio.Server | SniffingListener


async def listen(host: str, port: int, protocol_factory: Callable[[], asyncio.BaseProtocol],
                 tls: ServerTls, *, backlog: int = LISTEN_BACKLOG) -> Listener:
    """Listen on ``host:port`` (0: any free port) serving ``tls``'s mode; both kinds of
    result offer ``sockets``, ``close`` and ``wait_closed``.

    Raises:
        OSError: the port cannot be bound.
        ValueError: a TLS mode without a server context.
    """
    if tls.enabled and tls.context is None:
        raise ValueError(f"TLS mode {tls.mode} needs a server context")
    if tls.mode is TlsMode.PERMISSIVE:
        assert tls.context is not None
        sock = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
            backlog=backlog,
        )
        return SniffingListener(sock, protocol_factory, tls.context)  # type: ignore[arg-type]
    enforcing = tls.mode is TlsMode.ENFORCING
    return await asyncio.get_running_loop().create_server(
        protocol_factory, host, port, backlog=backlog, reuse_address=True,
        ssl=tls.context if enforcing else None,
        ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if enforcing else None,
    )
