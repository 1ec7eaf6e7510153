"""Group names are checked wherever they enter the broker, before any handler runs.

A consumer or producer group name must follow RocketMQ's rules (the topic character set
``[%|a-zA-Z0-9_-]``, at most 255 characters: ``tidemq.limits.group_name_problem``). Every
request that carries one (heartbeat, offsets, pull, send-back, subscription groups, locks,
client lists, unregistering) is checked here first; a malformed name is refused with
SYSTEM_ERROR and a remark naming the field and its value, and nothing is written: no offset in
consumerOffset.json, no subscription group, no retry (``%RETRY%<group>``) or dead-letter
(``%DLQ%<group>``) topic, which are derived only from names that passed.

``GroupNameChecked`` wraps the server the processors register on, so each handler of a code
below gets the check in front of it without knowing of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from tidemq.limits import group_name_problem
from tidemq.protocol import jsonx
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.command import RemotingCommand

Handler = Callable[..., Awaitable[RemotingCommand | None]]

# Request code -> the extFields that name a group.
HEADER_GROUP_FIELDS: dict[int, tuple[str, ...]] = {
    RequestCode.PULL_MESSAGE: ("consumerGroup",),
    RequestCode.QUERY_CONSUMER_OFFSET: ("consumerGroup",),
    RequestCode.UPDATE_CONSUMER_OFFSET: ("consumerGroup",),
    RequestCode.CONSUMER_SEND_MSG_BACK: ("group",),
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: ("consumerGroup",),
    RequestCode.UNREGISTER_CLIENT: ("producerGroup", "consumerGroup"),
    RequestCode.DELETE_SUBSCRIPTIONGROUP: ("groupName",),
}

# Request codes whose JSON body names groups.
BODY_GROUP_CODES = frozenset({
    RequestCode.HEART_BEAT,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    RequestCode.LOCK_BATCH_MQ,
    RequestCode.UNLOCK_BATCH_MQ,
})


# Group names that passed the rules, at most this many (the set starts over past it): the
# check depends on the name alone, and every pull (~0.3 per message at 20,000 msg/s) ran its
# regular expression. Far more groups than a broker serves at once, a few MB at most.
VALID_GROUP_NAMES_MAX = 10_000
_valid_group_names: set[str] = set()


def group_refusal(request: RemotingCommand) -> str | None:
    """The remark refusing ``request`` for a malformed group name, or None when every group
    name it carries is valid (or it carries none)."""
    fields = HEADER_GROUP_FIELDS.get(request.code)
    if fields is not None:
        ext_fields = request.ext_fields or {}
        for field in fields:
            value = ext_fields.get(field)
            if type(value) is str and value in _valid_group_names:
                continue
            # An empty optional field (UNREGISTER_CLIENT sends one of the two) is no name.
            if value is None or (value == "" and request.code == RequestCode.UNREGISTER_CLIENT):
                continue
            problem = _header_group_problem(value)
            if problem is not None:
                return f"{field} {value!r} is refused: {problem}"
    if request.code in BODY_GROUP_CODES and request.body:
        for field, value in _body_groups(request.code, request.body):
            # A missing or non-string name is the handler's to answer (it names the body).
            problem = group_name_problem(value) if isinstance(value, str) else None
            if problem is not None:
                return f"{field} {value!r} is refused: {problem}"
    return None


def _header_group_problem(value: object) -> str | None:
    """``group_name_problem`` of an extFields value, remembering the names that pass."""
    problem = group_name_problem(value)  # type: ignore[arg-type]
    if problem is None and type(value) is str:
        if len(_valid_group_names) >= VALID_GROUP_NAMES_MAX:
            _valid_group_names.clear()
        _valid_group_names.add(value)
    return problem


def _body_groups(code: int, body: bytes) -> Iterator[tuple[str, Any]]:
    try:
        document = jsonx.loads(body)
    except Exception:  # any parse failure is the handler's to answer
        return
    if not isinstance(document, dict):
        return
    if code == RequestCode.HEART_BEAT:
        for key in ("consumerDataSet", "producerDataSet"):
            entries = document.get(key)
            for entry in entries if isinstance(entries, list) else ():
                if isinstance(entry, dict) and "groupName" in entry:
                    yield f"{key}[].groupName", entry["groupName"]
    elif code == RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP:
        yield "groupName", document.get("groupName")
    elif "consumerGroup" in document:
        yield "consumerGroup", document["consumerGroup"]


def checked(handler: Handler) -> Handler:
    """``handler`` with the group-name check in front of it."""

    async def check_then_handle(request: RemotingCommand, *args: Any) -> RemotingCommand | None:
        remark = group_refusal(request)
        if remark is not None:
            return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, remark)
        return await handler(request, *args)

    return check_then_handle


def checked_now(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``checked`` for an immediate (plain, never waiting) handler."""

    def check_then_handle(request: RemotingCommand, *args: Any) -> RemotingCommand | None:
        remark = group_refusal(request)
        if remark is not None:
            return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, remark)
        return handler(request, *args)  # type: ignore[no-any-return]

    return check_then_handle


class GroupNameChecked:
    """A server proxy for ``register_processors``: handlers of the codes above are wrapped
    with ``checked``; everything else passes through to the server."""

    def __init__(self, server: Any) -> None:
        self._server = server

    def register(self, code: int, handler: Handler, **options: Any) -> None:
        """Register ``handler`` (checked first when ``code`` carries group names)."""
        if code in HEADER_GROUP_FIELDS or code in BODY_GROUP_CODES:
            handler = checked_now(handler) if options.get("immediate") else checked(handler)
            group_handler = options.pop("group_handler", None)
            if group_handler is not None:
                # A group handler serves many requests in one call; checking each first
                # keeps the answer request by request the same (the handler's contract).
                options["group_handler"] = (
                    _checked_group_now(group_handler) if options.get("immediate")
                    else _checked_group(group_handler))
        self._server.register(code, handler, **options)

    def register_default(self, handler: Handler, **options: Any) -> None:
        """Register the default handler (the admin codes), checked first: the check is a
        dict and a set lookup for codes that carry no group."""
        self._server.register_default(checked(handler), **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


def _checked_group(group_handler: Callable[..., Any]) -> Callable[..., Any]:
    async def check_then_handle(requests: list[RemotingCommand], *args: Any) -> list[Any]:
        refusals = [group_refusal(request) for request in requests]
        if not any(refusals):
            return await group_handler(requests, *args)
        passed = _passed(requests, refusals)
        return _merged(requests, refusals, await group_handler(passed, *args) if passed else [])

    return check_then_handle


def _checked_group_now(group_handler: Callable[..., Any]) -> Callable[..., Any]:
    """``_checked_group`` for an immediate group handler that returns its list of responses
    (the pulls': never an awaitable of it)."""

    def check_then_handle(requests: list[RemotingCommand], *args: Any) -> list[Any]:
        refusals = [group_refusal(request) for request in requests]
        if not any(refusals):
            return group_handler(requests, *args)  # type: ignore[no-any-return]
        passed = _passed(requests, refusals)
        return _merged(requests, refusals, group_handler(passed, *args) if passed else [])

    return check_then_handle


def _passed(requests: list[RemotingCommand], refusals: list[str | None]) -> list[RemotingCommand]:
    """The requests whose group name passed (``refusals``: a remark per request, or None)."""
    return [request for request, remark in zip(requests, refusals, strict=True)
            if remark is None]


def _merged(requests: list[RemotingCommand], refusals: list[str | None],
            answers: list[Any]) -> list[Any]:
    """Every request's answer in order: the group handler's ``answers`` to the passed ones,
    SYSTEM_ERROR with its remark to each refused one."""
    passed_answers = iter(answers)
    return [
        next(passed_answers) if remark is None
        else RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, remark)
        for request, remark in zip(requests, refusals, strict=True)
    ]
