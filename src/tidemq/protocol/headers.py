"""Typed request and response headers: views of a command's extFields (docs/protocol.md §4).

RocketMQ carries a request's parameters as a flat ``extFields`` map of strings, one entry per
field of a Java "custom header" class, keyed by the Java field name. Each class here is a
keyword-only dataclass whose fields are declared with ``ext_field("<javaName>")``:

- a field without a default is required: ``from_ext_fields`` raises ``HeaderFieldError`` when
  it is missing (Java's "the custom field <x> is null");
- the annotation gives the type: ``str``, ``int`` (Java int or long), ``bool`` or ``float``;
- unknown keys are ignored, so the ACL fields (``AccessKey``, ``Signature``), ``OnsChannel``
  and 4.9.5's ``bname`` pass through harmlessly.

Reading follows what real clients send: integers in decimal with an optional sign (never
``"4.0"``); booleans ``true``/``false`` in any case, and ``1``/``0`` because the C++ client
writes its booleans that way; an empty string in a non-text optional field counts as absent.
``to_ext_fields`` writes the Java way: decimal numbers, ``"true"``/``"false"``, None omitted.

SEND_MESSAGE (10) uses long field names and SEND_MESSAGE_V2 (310) / SEND_BATCH_MESSAGE (320)
the single letters ``a``..``n``; ``SendMessageRequestHeader`` reads and writes both.
"""

from __future__ import annotations

import dataclasses
import operator
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple, Self

from tidemq.errors import HeaderFieldError
from tidemq.protocol.codes import RequestCode

_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_TRUE_TEXTS = frozenset({"true", "1"})
_FALSE_TEXTS = frozenset({"false", "0"})


def ext_field(name: str, *, default: Any = dataclasses.MISSING, short_name: str | None = None):
    """Declare a header field carried in extFields under the Java name ``name``.

    Args:
        name: the extField key (the Java field name).
        default: the value when absent; without one the field is required.
        short_name: the key in the compact SEND v2 header (``a``..``n``), if any.
    """
    return dataclasses.field(
        default=default, metadata={"ext_name": name, "short_name": short_name}
    )


class _FieldSpec(NamedTuple):
    attribute: str
    name: str
    short_name: str | None
    kind: type
    required: bool
    default: Any


def _parse_str(text: str) -> str:
    return text


def _parse_int(text: str) -> int:
    if not _INTEGER.fullmatch(text):
        raise ValueError("expected a decimal integer such as 42")
    value = int(text)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError("expected an integer within the Java long range")
    return value


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE_TEXTS:
        return True
    if lowered in _FALSE_TEXTS:
        return False
    raise ValueError("expected true or false")


def _parse_float(text: str) -> float:
    try:
        if "_" not in text:
            return float(text)
    except ValueError:
        pass
    raise ValueError("expected a decimal number such as 0.5")


_PARSERS: dict[type, Callable[[str], Any]] = {
    str: _parse_str,
    int: _parse_int,
    bool: _parse_bool,
    float: _parse_float,
}


def _format(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _field_kind(annotation: Any) -> type:
    """``int`` from ``int`` or ``int | None``."""
    if isinstance(annotation, types.UnionType):
        kinds = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        annotation = kinds[0] if len(kinds) == 1 else None
    if annotation not in _PARSERS:
        raise TypeError(f"header field type {annotation!r} is not one of str, int, bool, float")
    return annotation


class Header:
    """Base of typed headers. Subclasses are ``@header`` dataclasses of ``ext_field``s."""

    __slots__ = ()
    _specs: ClassVar[tuple[_FieldSpec, ...]] = ()

    @classmethod
    def from_ext_fields(cls, ext: Mapping[str, str] | None) -> Self:
        """Read this header from a command's extFields (None reads as empty).

        Raises:
            HeaderFieldError: a required field is missing, or a field does not parse as its
                type. The message names the header, the field and the value.
        """
        return cls._read(ext or {}, short=False)

    def to_ext_fields(self) -> dict[str, str]:
        """The extFields a Java peer expects: every non-None field as a string."""
        return self._write(short=False)

    @classmethod
    def _read(cls, ext: Mapping[str, str], *, short: bool) -> Self:
        reader = _READERS.get((cls, short))
        if reader is None:
            reader = _READERS[cls, short] = _compile_reader(cls, short)
        try:
            header = reader(ext)
        except TypeError:  # a value that is no str and not hashable: the checked reader's
            header = None
        return header if header is not None else cls._read_checked(ext, short=short)

    @classmethod
    def _read_checked(cls, ext: Mapping[str, str], *, short: bool) -> Self:
        """The reference reader: any value the fast reader declined, and every error."""
        values: dict[str, Any] = {}
        for spec in cls._specs:
            key = spec.short_name if short and spec.short_name else spec.name
            text = ext.get(key)
            if text == "" and spec.kind is not str:
                text = None  # an empty number or flag says "not set", as Java treats it
            if text is None:
                if spec.required:
                    raise HeaderFieldError(
                        f"{cls.__name__}: required field {_label(spec, key)} is missing; "
                        "the request must carry it in extFields",
                        field=key,
                    )
                values[spec.attribute] = spec.default
                continue
            try:
                values[spec.attribute] = _PARSERS[spec.kind](str(text))
            except ValueError as e:
                raise HeaderFieldError(
                    f"{cls.__name__}: field {_label(spec, key)} is {str(text)[:100]!r}; {e}",
                    field=key,
                    value=str(text),
                ) from None
        return cls(**values)

    def _write(self, *, short: bool) -> dict[str, str]:
        cls = type(self)
        writer = _WRITERS.get((cls, short))
        if writer is None:
            writer = _WRITERS[cls, short] = _compile_writer(cls, short)
        return writer(self)


# -- compiled readers and writers ---------------------------------------------------------------
#
# Reading a header through the spec table costs a dict lookup, a parser call and a regex per
# field: about 5 us for a SEND v2 header, more than decoding the JSON it came in. So each class
# gets, on first use, a straight-line function per form generated from the same table (the way
# ``dataclasses`` builds ``__init__``). The fast reader takes only the plain cases -- strings,
# unsigned decimals of up to 18 digits (always within a Java long), exactly "true"/"false" --
# and returns None for anything else, which ``_read_checked`` then reads (or rejects, naming
# the field) exactly as before. So both readers agree wherever the fast one answers.
# Compiled per (class, short form); a race of two threads compiles twice, harmlessly.
_READERS: dict[tuple[type, bool], Callable[[Mapping[str, str]], Any]] = {}
_WRITERS: dict[tuple[type, bool], Callable[[Any], dict[str, str]]] = {}



def compile_codecs(*classes: type[Header]) -> None:
    """Compile the fast reader and writer of each class, both forms, now rather than at its
    first use: a compile (``exec`` of the generated source) costs ~0.3-1 ms, which the first
    request of a kind paid on its event loop (a server's first send or pull, a client's).
    Servers and clients call it as they start, for the headers of their hot requests."""
    for cls in classes:
        for short in (False, True):
            if (cls, short) not in _READERS:
                _READERS[cls, short] = _compile_reader(cls, short)
            if (cls, short) not in _WRITERS:
                _WRITERS[cls, short] = _compile_writer(cls, short)


_DECIMAL_DIGITS_FAST_MAX = 18  # 10**18 - 1 < 2**63 - 1: no range check needed

# The canonical texts ("0", "17", never "017" or "+1") of the numbers headers carry most --
# queue ids, flags, counts, retry times -- and their values: the fast reader looks a number
# up here first (~0.15 us less a field than the checks and int()); other texts are read as
# before. Up to 1023: queue ids past that are rare, and the table costs ~100 KB per process.
_SMALL_INTS: dict[str, int] = {str(number): number for number in range(1024)}
SMALL_INT_BY_TEXT = _SMALL_INTS  # the same table, for pull_request_reader's fast path
_MISSING = object()


def _reader_lines(spec: _FieldSpec, key: str, value: str, default: str) -> list[str]:
    """Lines of the fast reader that leave ``spec``'s value in ``value`` or return None."""
    lines = [f"    {value} = ext.get({key!r})"]
    keyword = "if"
    if not spec.required:
        lines += [f"    if {value} is None:", f"        {value} = {default}"]
        keyword = "elif"
    if spec.kind is str:
        return [*lines, f"    {keyword} {value}.__class__ is not str:", "        return None"]
    if spec.kind is int:
        # A small number's canonical text is looked up (one dict lookup); any other text
        # takes the plain-decimal checks and int().
        lines.insert(1, f"    number = small_int({value}, MISSING)")
        plain_decimal = (
            f"{value}.__class__ is str and {value}.isdigit() and {value}.isascii() "
            f"and len({value}) <= {_DECIMAL_DIGITS_FAST_MAX}"
        )
        branches = [("number is not MISSING", f"{value} = number"),
                    (plain_decimal, f"{value} = int({value})")]
    elif spec.kind is bool:
        branches = [(f"{value} == 'false'", f"{value} = False"),
                    (f"{value} == 'true'", f"{value} = True")]
    else:
        branches = []  # floats are rare: always read by the checked reader
    for condition, action in branches:
        lines += [f"    {keyword} {condition}:", f"        {action}"]
        keyword = "elif"
    if not spec.required and spec.kind is not str:
        # An empty number or flag says "not set", as in Java.
        lines += [f"    {keyword} {value} == '':", f"        {value} = {default}"]
        keyword = "elif"
    lines += ["    else:", "        return None"] if keyword == "elif" else ["    return None"]
    return lines


def _compile_reader(cls: type[Header], short: bool) -> Callable[[Mapping[str, str]], Any]:
    """``read(ext)``: the header, or None when a value needs the checked reader."""
    namespace: dict[str, Any] = {"cls": cls, "new": object.__new__,
                                 "small_int": _SMALL_INTS.get, "MISSING": _MISSING}
    lines = ["def read(ext):"]
    for index, spec in enumerate(cls._specs):
        key = spec.short_name if short and spec.short_name else spec.name
        namespace[f"default_{index}"] = spec.default
        lines += _reader_lines(spec, key, f"value_{index}", f"default_{index}")
    if hasattr(cls, "__post_init__") or cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        arguments = ", ".join(
            f"{spec.attribute}=value_{index}" for index, spec in enumerate(cls._specs)
        )
        lines.append(f"    return cls({arguments})")
    else:
        # The generated __init__ only stores the fields, and matching 14 keyword arguments
        # costs more than the rest of the read: store them into a bare instance instead.
        lines.append("    header = new(cls)")
        lines += [
            f"    header.{spec.attribute} = value_{index}" for index, spec in enumerate(cls._specs)
        ]
        lines.append("    return header")
    exec("\n".join(lines), namespace)  # the source is built from our own field table only
    return namespace["read"]


def _compile_writer(cls: type[Header], short: bool) -> Callable[[Any], dict[str, str]]:
    """``write(header)``: its extFields, every non-None field formatted as ``_format`` does."""
    lines = ["def write(header):", "    ext = {}"]
    for spec in cls._specs:
        key = spec.short_name if short and spec.short_name else spec.name
        if spec.kind is str:
            text = "value if value.__class__ is str else _format(value)"
        elif spec.kind is int:
            text = "str(value) if value.__class__ is int else _format(value)"
        elif spec.kind is bool:
            text = "('true' if value else 'false') if value.__class__ is bool else _format(value)"
        else:
            text = "_format(value)"
        lines += [
            f"    value = header.{spec.attribute}",
            "    if value is not None:",
            f"        ext[{key!r}] = {text}",
        ]
    lines.append("    return ext")
    namespace: dict[str, Any] = {"_format": _format}
    exec("\n".join(lines), namespace)  # the source is built from our own field table only
    return namespace["write"]


def _label(spec: _FieldSpec, key: str) -> str:
    return f"{key!r} ({spec.name})" if key != spec.name else repr(key)


_H = typing.TypeVar("_H", bound=type[Header])


def header(cls: _H) -> _H:
    """Make ``cls`` a keyword-only slotted dataclass and compile its field table."""
    cls = dataclasses.dataclass(kw_only=True, slots=True)(cls)
    hints = typing.get_type_hints(cls)
    specs = []
    for item in dataclasses.fields(cls):
        required = item.default is dataclasses.MISSING
        specs.append(
            _FieldSpec(
                attribute=item.name,
                name=item.metadata.get("ext_name", item.name),
                short_name=item.metadata.get("short_name"),
                kind=_field_kind(hints[item.name]),
                required=required,
                default=None if required else item.default,
            )
        )
    cls._specs = tuple(specs)
    return cls


# -- send ---------------------------------------------------------------------------------------

SEND_V2_CODES = frozenset(
    {RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2}
)


@header
class SendMessageRequestHeader(Header):
    """SEND_MESSAGE (10, long names) and SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (310/320, a..n)."""

    producer_group: str = ext_field("producerGroup", short_name="a")
    topic: str = ext_field("topic", short_name="b")
    default_topic: str = ext_field("defaultTopic", short_name="c")
    default_topic_queue_nums: int = ext_field("defaultTopicQueueNums", short_name="d")
    queue_id: int = ext_field("queueId", short_name="e")
    sys_flag: int = ext_field("sysFlag", short_name="f")
    born_timestamp: int = ext_field("bornTimestamp", short_name="g")
    flag: int = ext_field("flag", short_name="h")
    properties: str | None = ext_field("properties", default=None, short_name="i")
    reconsume_times: int | None = ext_field("reconsumeTimes", default=None, short_name="j")
    unit_mode: bool = ext_field("unitMode", default=False, short_name="k")
    max_reconsume_times: int | None = ext_field(
        "maxReconsumeTimes", default=None, short_name="l"
    )
    batch: bool = ext_field("batch", default=False, short_name="m")
    broker_name: str | None = ext_field("bname", default=None, short_name="n")

    @classmethod
    def from_ext_fields(cls, ext: Mapping[str, str] | None, code: int | None = None) -> Self:
        """Read a send header in the form ``code`` implies (v2 for 310/320/325).

        With ``code`` None the form is guessed: short keys when ``b`` (topic) is present.

        Raises:
            HeaderFieldError: as ``Header.from_ext_fields``.
        """
        ext = ext or {}
        short = code in SEND_V2_CODES if code is not None else "b" in ext
        return cls._read(ext, short=short)

    def to_ext_fields(self, v2: bool = True) -> dict[str, str]:
        """The extFields of SEND_MESSAGE_V2/SEND_BATCH_MESSAGE (``v2``) or SEND_MESSAGE."""
        return self._write(short=v2)


@header
class SendMessageResponseHeader(Header):
    """SEND response. A Java client reads MSG_REGION and TRACE_ON without a null check, so a
    broker must set both."""

    msg_id: str = ext_field("msgId")
    queue_id: int = ext_field("queueId")
    queue_offset: int = ext_field("queueOffset")
    transaction_id: str | None = ext_field("transactionId", default=None)
    msg_region: str | None = ext_field("MSG_REGION", default=None)
    trace_on: str | None = ext_field("TRACE_ON", default=None)


# -- pull and offsets ---------------------------------------------------------------------------


@header
class PullMessageRequestHeader(Header):
    """PULL_MESSAGE (11). ``sys_flag`` holds PullSysFlag bits."""

    consumer_group: str = ext_field("consumerGroup")
    topic: str = ext_field("topic")
    queue_id: int = ext_field("queueId")
    queue_offset: int = ext_field("queueOffset")
    max_msg_nums: int = ext_field("maxMsgNums")
    sys_flag: int = ext_field("sysFlag")
    commit_offset: int = ext_field("commitOffset")
    suspend_timeout_millis: int = ext_field("suspendTimeoutMillis")
    subscription: str | None = ext_field("subscription", default=None)
    sub_version: int = ext_field("subVersion")
    expression_type: str | None = ext_field("expressionType", default=None)


@header
class PullMessageResponseHeader(Header):
    """PULL_MESSAGE response; clients decode it for codes 0, 19, 20 and 21, so send all four."""

    suggest_which_broker_id: int = ext_field("suggestWhichBrokerId")
    next_begin_offset: int = ext_field("nextBeginOffset")
    min_offset: int = ext_field("minOffset")
    max_offset: int = ext_field("maxOffset")


# A pull answer's four numbers, in the order ``read_pull_answer_numbers`` returns them.
_PULL_ANSWER_TEXTS = operator.itemgetter(
    "suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset")


def read_pull_answer_numbers(ext: Mapping[str, str] | None) -> tuple[int, int, int, int] | None:
    """A PULL_MESSAGE answer's ``(suggestWhichBrokerId, nextBeginOffset, minOffset,
    maxOffset)`` read straight from its extFields when all four are plain decimals (1 to 18
    ASCII digits, as a broker writes them); None otherwise: ``PullMessageResponseHeader``
    then reads them, and names a missing or malformed field.

    Wherever it answers it gives the values the typed header gives (its fast reader takes
    the same texts), for a fifth of the typed read: a consumer reads one such header per
    pull answer, several thousand a second (RESULTS.md, consumer).
    """
    try:
        texts = _PULL_ANSWER_TEXTS(ext)  # type: ignore[arg-type]
        joined = "".join(texts)
    except (KeyError, TypeError):  # a field missing, no extFields, or a value not a str
        return None
    # Only ASCII digits in all four; none empty; none longer than the fast reader's 18.
    if (joined.isdigit() and joined.isascii() and "" not in texts
            and max(map(len, texts)) <= _DECIMAL_DIGITS_FAST_MAX):
        return tuple(map(int, texts))  # type: ignore[return-value]
    return None


# The headers every message's requests carry (its send and its pull, both ways): servers and
# clients compile their codecs as they start (``compile_codecs``).
MESSAGE_PATH_HEADERS: tuple[type[Header], ...] = (
    SendMessageRequestHeader, SendMessageResponseHeader,
    PullMessageRequestHeader, PullMessageResponseHeader,
)


@header
class QueryConsumerOffsetRequestHeader(Header):
    """QUERY_CONSUMER_OFFSET (14)."""

    consumer_group: str = ext_field("consumerGroup")
    topic: str = ext_field("topic")
    queue_id: int = ext_field("queueId")


@header
class QueryConsumerOffsetResponseHeader(Header):
    """QUERY_CONSUMER_OFFSET response."""

    offset: int = ext_field("offset")


@header
class UpdateConsumerOffsetRequestHeader(Header):
    """UPDATE_CONSUMER_OFFSET (15); the response has no header fields."""

    consumer_group: str = ext_field("consumerGroup")
    topic: str = ext_field("topic")
    queue_id: int = ext_field("queueId")
    commit_offset: int = ext_field("commitOffset")


@header
class GetMaxOffsetRequestHeader(Header):
    """GET_MAX_OFFSET (30)."""

    topic: str = ext_field("topic")
    queue_id: int = ext_field("queueId")


@header
class GetMaxOffsetResponseHeader(Header):
    """GET_MAX_OFFSET response: the next queue offset to be written."""

    offset: int = ext_field("offset")


@header
class GetMinOffsetRequestHeader(Header):
    """GET_MIN_OFFSET (31)."""

    topic: str = ext_field("topic")
    queue_id: int = ext_field("queueId")


@header
class GetMinOffsetResponseHeader(Header):
    """GET_MIN_OFFSET response."""

    offset: int = ext_field("offset")


@header
class SearchOffsetRequestHeader(Header):
    """SEARCH_OFFSET_BY_TIMESTAMP (29); ``timestamp`` in ms."""

    topic: str = ext_field("topic")
    queue_id: int = ext_field("queueId")
    timestamp: int = ext_field("timestamp")


@header
class SearchOffsetResponseHeader(Header):
    """SEARCH_OFFSET_BY_TIMESTAMP response."""

    offset: int = ext_field("offset")


@header
class GetEarliestMsgStoretimeRequestHeader(Header):
    """GET_EARLIEST_MSG_STORETIME (32)."""

    topic: str = ext_field("topic")
    queue_id: int = ext_field("queueId")


@header
class GetEarliestMsgStoretimeResponseHeader(Header):
    """GET_EARLIEST_MSG_STORETIME response; ``timestamp`` in ms."""

    timestamp: int = ext_field("timestamp")


# -- messages by id or key ----------------------------------------------------------------------


@header
class ViewMessageRequestHeader(Header):
    """VIEW_MESSAGE_BY_ID (33): ``offset`` is the commit-log physical offset."""

    offset: int = ext_field("offset")


@header
class QueryMessageRequestHeader(Header):
    """QUERY_MESSAGE (12). ``unique_key_query`` is the extra ``_UNIQUE_KEY_QUERY`` extField."""

    topic: str = ext_field("topic")
    key: str = ext_field("key")
    max_num: int = ext_field("maxNum")
    begin_timestamp: int = ext_field("beginTimestamp")
    end_timestamp: int = ext_field("endTimestamp")
    unique_key_query: bool | None = ext_field("_UNIQUE_KEY_QUERY", default=None)


@header
class QueryMessageResponseHeader(Header):
    """QUERY_MESSAGE response."""

    index_last_update_timestamp: int = ext_field("indexLastUpdateTimestamp")
    index_last_update_phyoffset: int = ext_field("indexLastUpdatePhyoffset")


# -- clients, retries, transactions -------------------------------------------------------------


@header
class UnregisterClientRequestHeader(Header):
    """UNREGISTER_CLIENT (35)."""

    client_id: str = ext_field("clientID")
    producer_group: str | None = ext_field("producerGroup", default=None)
    consumer_group: str | None = ext_field("consumerGroup", default=None)


@header
class GetConsumerListByGroupRequestHeader(Header):
    """GET_CONSUMER_LIST_BY_GROUP (38); the answer is a JSON body."""

    consumer_group: str = ext_field("consumerGroup")


@header
class NotifyConsumerIdsChangedRequestHeader(Header):
    """NOTIFY_CONSUMER_IDS_CHANGED (40), broker to consumer, oneway."""

    consumer_group: str = ext_field("consumerGroup")


@header
class ConsumerSendMsgBackRequestHeader(Header):
    """CONSUMER_SEND_MSG_BACK (36): ``offset`` is the consumed message's commit-log offset."""

    offset: int = ext_field("offset")
    group: str = ext_field("group")
    delay_level: int = ext_field("delayLevel")
    origin_msg_id: str | None = ext_field("originMsgId", default=None)
    origin_topic: str | None = ext_field("originTopic", default=None)
    unit_mode: bool = ext_field("unitMode", default=False)
    max_reconsume_times: int | None = ext_field("maxReconsumeTimes", default=None)


@header
class EndTransactionRequestHeader(Header):
    """END_TRANSACTION (37). ``commit_or_rollback``: 0 unknown, 8 commit, 12 rollback."""

    producer_group: str = ext_field("producerGroup")
    tran_state_table_offset: int = ext_field("tranStateTableOffset")
    commit_log_offset: int = ext_field("commitLogOffset")
    commit_or_rollback: int = ext_field("commitOrRollback")
    from_transaction_check: bool = ext_field("fromTransactionCheck", default=False)
    msg_id: str = ext_field("msgId")
    transaction_id: str | None = ext_field("transactionId", default=None)


@header
class CheckTransactionStateRequestHeader(Header):
    """CHECK_TRANSACTION_STATE (39), broker to producer, oneway."""

    tran_state_table_offset: int = ext_field("tranStateTableOffset")
    commit_log_offset: int = ext_field("commitLogOffset")
    msg_id: str | None = ext_field("msgId", default=None)
    transaction_id: str | None = ext_field("transactionId", default=None)
    offset_msg_id: str | None = ext_field("offsetMsgId", default=None)


# -- admin on the broker ------------------------------------------------------------------------


@header
class CreateTopicRequestHeader(Header):
    """UPDATE_AND_CREATE_TOPIC (17). ``perm`` holds PermName bits (6 = read + write)."""

    topic: str = ext_field("topic")
    default_topic: str = ext_field("defaultTopic")
    read_queue_nums: int = ext_field("readQueueNums")
    write_queue_nums: int = ext_field("writeQueueNums")
    perm: int = ext_field("perm")
    topic_filter_type: str = ext_field("topicFilterType")
    topic_sys_flag: int | None = ext_field("topicSysFlag", default=None)
    order: bool = ext_field("order", default=False)


@header
class DeleteTopicRequestHeader(Header):
    """DELETE_TOPIC_IN_BROKER (215)."""

    topic: str = ext_field("topic")


@header
class GetTopicStatsInfoRequestHeader(Header):
    """GET_TOPIC_STATS_INFO (202)."""

    topic: str = ext_field("topic")


@header
class GetConsumeStatsRequestHeader(Header):
    """GET_CONSUME_STATS (208); without ``topic`` every subscribed topic counts."""

    consumer_group: str = ext_field("consumerGroup")
    topic: str | None = ext_field("topic", default=None)


@header
class QueryTopicConsumeByWhoRequestHeader(Header):
    """QUERY_TOPIC_CONSUME_BY_WHO (300)."""

    topic: str = ext_field("topic")


@header
class GetConsumerConnectionListRequestHeader(Header):
    """GET_CONSUMER_CONNECTION_LIST (203)."""

    consumer_group: str = ext_field("consumerGroup")


@header
class GetProducerConnectionListRequestHeader(Header):
    """GET_PRODUCER_CONNECTION_LIST (204)."""

    producer_group: str = ext_field("producerGroup")


@header
class DeleteSubscriptionGroupRequestHeader(Header):
    """DELETE_SUBSCRIPTIONGROUP (207)."""

    group_name: str = ext_field("groupName")
    remove_offset: bool = ext_field("removeOffset", default=False)


@header
class ResetOffsetRequestHeader(Header):
    """INVOKE_BROKER_TO_RESET_OFFSET (222); the force flag's key really is ``isForce``."""

    topic: str = ext_field("topic")
    group: str = ext_field("group")
    timestamp: int = ext_field("timestamp")
    is_force: bool = ext_field("isForce")


@header
class GetConsumerStatusRequestHeader(Header):
    """INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223) from an admin, and the broker's
    GET_CONSUMER_STATUS_FROM_CLIENT (221) to each consumer; ``client_addr`` (admin only)
    picks one consumer by its client id."""

    topic: str = ext_field("topic")
    group: str = ext_field("group")
    client_addr: str | None = ext_field("clientAddr", default=None)


@header
class GetConsumerRunningInfoRequestHeader(Header):
    """GET_CONSUMER_RUNNING_INFO (307): admin -> broker, forwarded as is to the consumer."""

    consumer_group: str = ext_field("consumerGroup")
    client_id: str = ext_field("clientId")
    jstack_enable: bool = ext_field("jstackEnable", default=False)


# -- name server --------------------------------------------------------------------------------


@header
class GetRouteInfoRequestHeader(Header):
    """GET_ROUTEINFO_BY_TOPIC (105). ``accept_standard_json_only``: 4.9.4+ clients."""

    topic: str = ext_field("topic")
    accept_standard_json_only: bool | None = ext_field("acceptStandardJsonOnly", default=None)


@header
class RegisterBrokerRequestHeader(Header):
    """REGISTER_BROKER (103). ``body_crc32`` 0 means "not given"."""

    broker_name: str = ext_field("brokerName")
    broker_addr: str = ext_field("brokerAddr")
    cluster_name: str = ext_field("clusterName")
    ha_server_addr: str = ext_field("haServerAddr")
    broker_id: int = ext_field("brokerId")
    compressed: bool = ext_field("compressed", default=False)
    body_crc32: int = ext_field("bodyCrc32", default=0)


@header
class RegisterBrokerResponseHeader(Header):
    """REGISTER_BROKER response; set for slaves whose master is alive."""

    ha_server_addr: str | None = ext_field("haServerAddr", default=None)
    master_addr: str | None = ext_field("masterAddr", default=None)


@header
class UnregisterBrokerRequestHeader(Header):
    """UNREGISTER_BROKER (104)."""

    broker_name: str = ext_field("brokerName")
    broker_addr: str = ext_field("brokerAddr")
    cluster_name: str = ext_field("clusterName")
    broker_id: int = ext_field("brokerId")


@header
class QueryDataVersionRequestHeader(Header):
    """QUERY_DATA_VERSION (322); the body is the broker's DataVersion JSON."""

    broker_name: str = ext_field("brokerName")
    broker_addr: str = ext_field("brokerAddr")
    cluster_name: str = ext_field("clusterName")
    broker_id: int = ext_field("brokerId")


@header
class QueryDataVersionResponseHeader(Header):
    """QUERY_DATA_VERSION response."""

    changed: bool = ext_field("changed")


@header
class GetKVConfigRequestHeader(Header):
    """GET_KV_CONFIG (101)."""

    namespace: str = ext_field("namespace")
    key: str = ext_field("key")


@header
class GetKVConfigResponseHeader(Header):
    """GET_KV_CONFIG response."""

    value: str | None = ext_field("value", default=None)


@header
class PutKVConfigRequestHeader(Header):
    """PUT_KV_CONFIG (100)."""

    namespace: str = ext_field("namespace")
    key: str = ext_field("key")
    value: str = ext_field("value")


@header
class DeleteKVConfigRequestHeader(Header):
    """DELETE_KV_CONFIG (102)."""

    namespace: str = ext_field("namespace")
    key: str = ext_field("key")


@header
class GetKVListByNamespaceRequestHeader(Header):
    """GET_KVLIST_BY_NAMESPACE (219)."""

    namespace: str = ext_field("namespace")


@header
class GetTopicsByClusterRequestHeader(Header):
    """GET_TOPICS_BY_CLUSTER (224)."""

    cluster: str = ext_field("cluster")


@header
class WipeWritePermOfBrokerRequestHeader(Header):
    """WIPE_WRITE_PERM_OF_BROKER (205)."""

    broker_name: str = ext_field("brokerName")


@header
class WipeWritePermOfBrokerResponseHeader(Header):
    """WIPE_WRITE_PERM_OF_BROKER response."""

    wipe_topic_count: int = ext_field("wipeTopicCount")


@header
class AddWritePermOfBrokerRequestHeader(Header):
    """ADD_WRITE_PERM_OF_BROKER (327)."""

    broker_name: str = ext_field("brokerName")


@header
class AddWritePermOfBrokerResponseHeader(Header):
    """ADD_WRITE_PERM_OF_BROKER response."""

    add_topic_count: int = ext_field("addTopicCount")


@header
class DeleteTopicFromNamesrvRequestHeader(Header):
    """DELETE_TOPIC_IN_NAMESRV (216)."""

    topic: str = ext_field("topic")
    cluster_name: str | None = ext_field("clusterName", default=None)


# -- lookup by code -----------------------------------------------------------------------------

REQUEST_HEADERS: dict[int, type[Header]] = {
    RequestCode.SEND_MESSAGE: SendMessageRequestHeader,
    RequestCode.SEND_MESSAGE_V2: SendMessageRequestHeader,
    RequestCode.SEND_BATCH_MESSAGE: SendMessageRequestHeader,
    RequestCode.PULL_MESSAGE: PullMessageRequestHeader,
    RequestCode.QUERY_MESSAGE: QueryMessageRequestHeader,
    RequestCode.QUERY_CONSUMER_OFFSET: QueryConsumerOffsetRequestHeader,
    RequestCode.UPDATE_CONSUMER_OFFSET: UpdateConsumerOffsetRequestHeader,
    RequestCode.UPDATE_AND_CREATE_TOPIC: CreateTopicRequestHeader,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: SearchOffsetRequestHeader,
    RequestCode.GET_MAX_OFFSET: GetMaxOffsetRequestHeader,
    RequestCode.GET_MIN_OFFSET: GetMinOffsetRequestHeader,
    RequestCode.GET_EARLIEST_MSG_STORETIME: GetEarliestMsgStoretimeRequestHeader,
    RequestCode.VIEW_MESSAGE_BY_ID: ViewMessageRequestHeader,
    RequestCode.UNREGISTER_CLIENT: UnregisterClientRequestHeader,
    RequestCode.CONSUMER_SEND_MSG_BACK: ConsumerSendMsgBackRequestHeader,
    RequestCode.END_TRANSACTION: EndTransactionRequestHeader,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: GetConsumerListByGroupRequestHeader,
    RequestCode.CHECK_TRANSACTION_STATE: CheckTransactionStateRequestHeader,
    RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: NotifyConsumerIdsChangedRequestHeader,
    RequestCode.PUT_KV_CONFIG: PutKVConfigRequestHeader,
    RequestCode.GET_KV_CONFIG: GetKVConfigRequestHeader,
    RequestCode.DELETE_KV_CONFIG: DeleteKVConfigRequestHeader,
    RequestCode.REGISTER_BROKER: RegisterBrokerRequestHeader,
    RequestCode.UNREGISTER_BROKER: UnregisterBrokerRequestHeader,
    RequestCode.GET_ROUTEINFO_BY_TOPIC: GetRouteInfoRequestHeader,
    RequestCode.GET_TOPIC_STATS_INFO: GetTopicStatsInfoRequestHeader,
    RequestCode.GET_CONSUMER_CONNECTION_LIST: GetConsumerConnectionListRequestHeader,
    RequestCode.GET_PRODUCER_CONNECTION_LIST: GetProducerConnectionListRequestHeader,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER: WipeWritePermOfBrokerRequestHeader,
    RequestCode.DELETE_SUBSCRIPTIONGROUP: DeleteSubscriptionGroupRequestHeader,
    RequestCode.GET_CONSUME_STATS: GetConsumeStatsRequestHeader,
    RequestCode.DELETE_TOPIC_IN_BROKER: DeleteTopicRequestHeader,
    RequestCode.DELETE_TOPIC_IN_NAMESRV: DeleteTopicFromNamesrvRequestHeader,
    RequestCode.GET_KVLIST_BY_NAMESPACE: GetKVListByNamespaceRequestHeader,
    RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: ResetOffsetRequestHeader,
    RequestCode.GET_TOPICS_BY_CLUSTER: GetTopicsByClusterRequestHeader,
    RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: QueryTopicConsumeByWhoRequestHeader,
    RequestCode.QUERY_DATA_VERSION: QueryDataVersionRequestHeader,
    RequestCode.ADD_WRITE_PERM_OF_BROKER: AddWritePermOfBrokerRequestHeader,
}
"""The request header class of each request code that has one (SEND codes share one class;
call ``SendMessageRequestHeader.from_ext_fields(ext, code)`` for those)."""

RESPONSE_HEADERS: dict[int, type[Header]] = {
    RequestCode.SEND_MESSAGE: SendMessageResponseHeader,
    RequestCode.SEND_MESSAGE_V2: SendMessageResponseHeader,
    RequestCode.SEND_BATCH_MESSAGE: SendMessageResponseHeader,
    RequestCode.PULL_MESSAGE: PullMessageResponseHeader,
    RequestCode.QUERY_MESSAGE: QueryMessageResponseHeader,
    RequestCode.QUERY_CONSUMER_OFFSET: QueryConsumerOffsetResponseHeader,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: SearchOffsetResponseHeader,
    RequestCode.GET_MAX_OFFSET: GetMaxOffsetResponseHeader,
    RequestCode.GET_MIN_OFFSET: GetMinOffsetResponseHeader,
    RequestCode.GET_EARLIEST_MSG_STORETIME: GetEarliestMsgStoretimeResponseHeader,
    RequestCode.GET_KV_CONFIG: GetKVConfigResponseHeader,
    RequestCode.REGISTER_BROKER: RegisterBrokerResponseHeader,
    RequestCode.QUERY_DATA_VERSION: QueryDataVersionResponseHeader,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER: WipeWritePermOfBrokerResponseHeader,
    RequestCode.ADD_WRITE_PERM_OF_BROKER: AddWritePermOfBrokerResponseHeader,
}
"""The response header class for the response to each request code that has one."""


def read_request_header(code: int, ext: Mapping[str, str] | None) -> Header | None:
    """The typed request header of a request with ``code``, or None when its code has none.

    Raises:
        HeaderFieldError: a required field is missing or a field does not parse.
    """
    cls = REQUEST_HEADERS.get(code)
    if cls is None:
        return None
    if cls is SendMessageRequestHeader:
        return SendMessageRequestHeader.from_ext_fields(ext, code)
    return cls.from_ext_fields(ext)


@header
class NotifyBrokerRoleChangedRequestHeader(Header):
    """NOTIFY_BROKER_ROLE_CHANGED (1008, RocketMQ 5): a controller tells a broker its role.

    RocketMQ 5's fields: masterAddress, masterEpoch, syncStateSetEpoch, brokerId (this
    broker's id as a slave; newer releases also send masterBrokerId). tidemq adds
    masterHaAddress (the master's HA address; default: masterAddress's port + 1) and
    masterRole (SYNC_MASTER or ASYNC_MASTER for a broker becoming master).
    """

    master_address: str = ext_field("masterAddress")
    master_epoch: int = ext_field("masterEpoch")
    sync_state_set_epoch: int | None = ext_field("syncStateSetEpoch", default=None)
    broker_id: int | None = ext_field("brokerId", default=None)
    master_broker_id: int | None = ext_field("masterBrokerId", default=None)
    master_ha_address: str | None = ext_field("masterHaAddress", default=None)
    master_role: str | None = ext_field("masterRole", default=None)
