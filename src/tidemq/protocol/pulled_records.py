"""Decoding a pull's records for a consumer: the properties string is parsed on first use.

A consumer pulls thousands of records a second and most of it never looks at a message's
properties (it reads the body, perhaps the tags or keys). Parsing the properties string
into a dict is the largest part of decoding a record (about a quarter of it), so a pulled
record keeps its properties as the stored text and parses them when ``properties`` (or
``tags``, ``keys``, ``msg_id``, ...) is first read; the result is kept, so a second read and
a change made through ``message.properties[...] = ...`` behave as on any ``MessageExt``.

Everything else is read at once, exactly as ``message.decode_records`` reads it, and the
checks are the same: a record that is not the common kind (v1 magic, IPv4 hosts) or whose
sizes do not add up goes to the same field-by-field reader, which names what is wrong.
"""

from __future__ import annotations

from typing import Any

from tidemq.protocol.message import (
    _HOSTS_V6,
    _INT16,
    MAGIC_V1,
    RECORD_FIXED_SIZE_IPV4,
    RECORD_PREFIX_SIZE_IPV4,
    MessageExt,
    _decode_record_checked,
    _unpack_prefix_ipv4,
    decode_properties,
    unpack_host,
)

__all__ = ["PulledMessageExt", "decode_pulled_records"]

_properties_slot = MessageExt.__dict__["properties"]  # the base class's slot descriptor
_get_properties = _properties_slot.__get__
_set_properties = _properties_slot.__set__
_unpack_int16 = _INT16.unpack_from


class PulledMessageExt(MessageExt):
    """A ``MessageExt`` decoded from a pull; its properties are parsed on first use.

    It is a ``MessageExt`` in every way a caller can see: the same fields, equal to a
    ``MessageExt`` with the same values, picklable; ``properties`` is a dict once read.
    """

    __slots__ = ("_properties_text",)

    @property  # type: ignore[override]
    def properties(self) -> dict[str, str]:
        value = _get_properties(self)
        if value is None:
            value = decode_properties(self._properties_text)
            _set_properties(self, value)
        return value

    @properties.setter
    def properties(self, value: dict[str, str]) -> None:
        _set_properties(self, value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageExt):
            return NotImplemented
        return _field_values(self) == _field_values(other)

    __hash__ = None  # type: ignore[assignment]  # as MessageExt: mutable, unhashable


_FIELD_NAMES = tuple(MessageExt.__dataclass_fields__)


def _field_values(message: MessageExt) -> tuple[Any, ...]:
    return tuple(getattr(message, name) for name in _FIELD_NAMES)


def decode_pulled_records(data: bytes | bytearray | memoryview) -> list[MessageExt]:
    """All records of a pull body, in order, with lazily parsed properties (module docstring).

    Raises:
        RemoteProtocolError: a record is malformed or the bytes end inside one (as
            ``message.decode_records``).
    """
    if type(data) is bytes:
        return _decode(data)
    with memoryview(data) as view:
        return _decode(view)


def _decode(source: bytes | memoryview) -> list[MessageExt]:
    messages: list[MessageExt] = []
    append = messages.append
    position = 0
    end = len(source)
    while position < end:
        # The fast path of message._decode_record, with the properties left as text.
        available = end - position
        if available >= RECORD_FIXED_SIZE_IPV4:
            (
                total, magic, crc, queue_id, flag, queue_offset, physical_offset, sysflag,
                born_timestamp, born_address, born_port, store_timestamp, store_address,
                store_port, reconsume_times, prepared_offset, body_length,
            ) = _unpack_prefix_ipv4(source, position)
            body_start = position + RECORD_PREFIX_SIZE_IPV4
            body_end = body_start + body_length
            record_end = position + total
            if (
                magic == MAGIC_V1
                and not sysflag & _HOSTS_V6
                and total <= available
                and body_length >= 0
                and body_end + 3 <= record_end
            ):
                topic_end = body_end + 1 + source[body_end]
                properties_start = topic_end + 2
                if (
                    properties_start <= record_end
                    and properties_start + _unpack_int16(source, topic_end)[0] == record_end
                ):
                    message = PulledMessageExt(
                        str(source[body_end + 1 : topic_end], "utf-8", "replace"),
                        bytes(source[body_start:body_end]),
                        flag,
                        None,  # type: ignore[arg-type]  # parsed on first use
                        queue_id,
                        queue_offset,
                        physical_offset,
                        sysflag,
                        born_timestamp,
                        unpack_host(born_address, born_port),
                        store_timestamp,
                        unpack_host(store_address, store_port),
                        reconsume_times,
                        prepared_offset,
                        crc,
                        total,
                    )
                    message._properties_text = str(
                        source[properties_start:record_end], "utf-8", "replace"
                    )
                    append(message)
                    position = record_end
                    continue
        checked = _decode_record_checked(source, position, end)
        append(checked)
        position += checked.store_size
    return messages
