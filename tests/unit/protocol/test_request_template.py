"""A request rendered from a JsonRequestTemplate is the request the general encoder writes.

The template pastes values into fixed header text instead of building a dict and encoding it
(a producer's plain sends, a consumer's parked pulls); these tests hold it to the general
JSON encoder byte for byte, and check that a rendered request's extFields can be read and
changed like any request's, with the bytes sent following the change.
"""

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.errors import LocalProtocolError
from tidemq.protocol.command import (
    JsonRequestTemplate,
    RemotingCommand,
    TemplateRequest,
    decode_command,
    json_plain,
)

# Text that needs no escaping in JSON, non-ASCII included.
# (What Python does not call printable is refused, escaped by orjson or not: the general
# encoder takes it.)
plain_text = st.text(st.one_of(
    st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"),
                  blacklist_characters='"\\'),
    st.just(" ")), max_size=20)
names = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ_", min_size=1, max_size=12)


def general(code, opaque, fields, body):
    return RemotingCommand(code, opaque, 0, None, dict(fields), body).encode_parts()


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(names, st.one_of(st.none(), plain_text), max_size=8),
       st.data(), st.integers(0, 2**31 - 1), st.one_of(st.none(), st.binary(max_size=64)),
       st.integers(-(2**31), 2**31 - 1))
def test_a_rendered_request_is_byte_for_byte_the_general_encoding(fields, data, opaque, body,
                                                                  code):
    template = JsonRequestTemplate(code, fields)
    variable = sorted(name for name, value in fields.items() if value is None)
    assert template.variable_names == tuple(variable)
    values = tuple(data.draw(plain_text) for _ in variable)
    rendered = template.render(opaque, values, body)
    full = {name: value for name, value in fields.items() if value is not None}
    full.update(zip(variable, values, strict=True))
    assert rendered.encode_parts() == general(code, opaque, full, body or None)
    assert decode_command(b"".join(rendered.encode_parts())[4:]) == RemotingCommand(
        code, opaque, 0, None, full, body or None)


def test_fixed_text_that_needs_escaping_is_refused_so_the_caller_encodes_it_in_general():
    for value in ('say "hi"', "back\\slash", "line\nbreak", "\x01"):
        assert not json_plain(value)
        with pytest.raises(ValueError, match="needs JSON escaping"):
            JsonRequestTemplate(310, {"b": value, "e": None})
    assert json_plain("Orders_%RETRY%-1|x {braces} héllo")
    template = JsonRequestTemplate(310, {"b": "{0}{opaque}", "e": None})  # braces: literal
    assert template.render(5, ("{1}",)).encode_parts() == general(
        310, 5, {"b": "{0}{opaque}", "e": "{1}"}, None)


def test_a_rendered_requests_fields_read_changed_or_replaced_go_out_as_they_now_are():
    template = JsonRequestTemplate(11, {"topic": "T", "queueOffset": None})
    request = template.render(7, ("42",))
    assert isinstance(request, TemplateRequest)
    assert request == RemotingCommand(11, 7, 0, None, {"topic": "T", "queueOffset": "42"})
    assert RemotingCommand(11, 7, 0, None, {"topic": "T", "queueOffset": "42"}) == request
    request.ext_fields["Signature"] = "abc"  # a request hook adding a field to the dict read
    sent = orjson.loads(request.encode_parts()[0][8:])
    assert sent["extFields"] == {"topic": "T", "queueOffset": "42", "Signature": "abc"}
    replaced = template.render(8, ("1",), b"body")
    replaced.ext_fields = {"x": "y"}
    assert replaced.encode_parts() == general(11, 8, {"x": "y"}, b"body")
    emptied = template.render(9, ("1",))
    emptied.ext_fields = None
    assert emptied.encode_parts() == RemotingCommand(11, 9).encode_parts()


def test_a_header_too_long_for_its_frame_is_refused_before_anything_is_sent():
    template = JsonRequestTemplate(310, {"i": None})
    with pytest.raises(LocalProtocolError, match="too long"):
        template.render(1, ("x" * (1 << 24),))
