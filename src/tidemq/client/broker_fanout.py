"""One admin request asked of several brokers in turn, for answers merged over a cluster."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from tidemq.protocol.codes import ResponseCode
from tidemq.protocol.command import RemotingCommand
from tidemq.remoting.errors import RemotingError

if TYPE_CHECKING:
    from tidemq.client.instance import ClientInstance


async def ask_each_broker(
    instance: ClientInstance,
    targets: Iterable[tuple[str, str]],
    code: int,
    fields: Mapping[str, str],
    *,
    timeout_ms: int | None = None,
    first_only: bool = False,
) -> tuple[list[tuple[str, RemotingCommand]], list[str]]:
    """Send request ``code`` to each ``(label, address)`` of ``targets``, one after the other.

    Returns:
        The SUCCESS responses as ``(label, response)``, in the order asked (only the first
        with ``first_only``), and a ``"label: why"`` line for each broker that could not be
        reached or answered another code, for an error message that names them all.
    """
    answers: list[tuple[str, RemotingCommand]] = []
    refusals: list[str] = []
    for label, address in targets:
        try:
            response = await instance.invoke(address, code, fields, timeout_ms=timeout_ms)
        except RemotingError as e:
            refusals.append(f"{label}: {e}")
            continue
        if response.code != ResponseCode.SUCCESS:
            refusals.append(f"{label}: {response.remark or response.code}")
            continue
        answers.append((label, response))
        if first_only:
            break
    return answers, refusals
