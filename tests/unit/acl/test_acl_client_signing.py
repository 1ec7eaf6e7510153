"""The client's signing hook against the server's ACL guard, over real loopback sockets."""

from __future__ import annotations

import asyncio

import pytest
from acl_helpers import write_acl

from tidemq.acl import AclService
from tidemq.client.security import Credentials
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting import RemotingClient, RemotingServer


async def _ok(request, connection):
    return RemotingCommand.response_to(request, ResponseCode.SUCCESS)


def _exchange(tmp_path, credentials, body_size=2):
    service = AclService(write_acl(tmp_path))
    handled: list[int] = []

    async def record(request, connection):
        handled.append(request.code)
        return await _ok(request, connection)

    async def main():
        hook = credentials.request_hook() if credentials else None
        async with RemotingServer("127.0.0.1", [0]) as server, RemotingClient(
            request_hook=hook
        ) as client:
            server.register_default(record)
            server.set_request_guard(service.guard)
            addr = f"127.0.0.1:{server.bound_ports[0]}"
            template = {"a": "pg", "b": "Orders"}  # shared, as hot paths share templates
            responses = [
                await client.invoke(addr, RemotingCommand(
                    RequestCode.SEND_MESSAGE_V2, n + 1, ext_fields=template,
                    body=(b"m%d" % n).ljust(body_size, b".")))
                for n in range(3)
            ]
            assert template == {"a": "pg", "b": "Orders"}  # the hook copied, never mutated
            return responses

    return asyncio.run(main()), handled


# 64 KiB bodies take the deferred path: the signature is checked in the guard's worker thread.
BODY_SIZES = [2, 64 * 1024]


@pytest.mark.parametrize("body_size", BODY_SIZES)
def test_signed_requests_pass_the_guard(tmp_path, body_size):
    responses, handled = _exchange(tmp_path, Credentials("publisher", "pub-secret"), body_size)
    assert [r.code for r in responses] == [ResponseCode.SUCCESS] * 3
    assert handled == [RequestCode.SEND_MESSAGE_V2] * 3


@pytest.mark.parametrize("body_size", BODY_SIZES)
@pytest.mark.parametrize("credentials", [None, Credentials("publisher", "wrong-secret"),
                                         Credentials("consumer", "sub-secret")])
def test_unsigned_wrongly_signed_or_unpermitted_requests_reach_no_handler(
        tmp_path, credentials, body_size):
    responses, handled = _exchange(tmp_path, credentials, body_size)
    assert {r.code for r in responses} == {ResponseCode.NO_PERMISSION}
    assert handled == []


def test_credentials_hide_the_secret_and_read_the_environment(monkeypatch):
    credentials = Credentials("ak-1234567", "very-secret-key", "token")
    assert "very-secret-key" not in repr(credentials) and "token" not in repr(credentials)
    monkeypatch.delenv("TIDEMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("TIDEMQ_SECRET_KEY", raising=False)
    assert Credentials.from_env() is None
    monkeypatch.setenv("TIDEMQ_ACCESS_KEY", "ak-1234567")
    with pytest.raises(ValueError, match="TIDEMQ_SECRET_KEY"):
        Credentials.from_env()
    monkeypatch.setenv("TIDEMQ_SECRET_KEY", "sk-1234567")
    assert Credentials.from_env() == Credentials("ak-1234567", "sk-1234567")
