"""The ACL request signature: content order, body, HMAC-SHA1 and base64 as RocketMQ computes.

Expected values were computed with ``openssl dgst -sha1 -hmac KEY -binary | base64`` over
the content bytes, independently of this code.
"""

from __future__ import annotations

from tidemq.protocol.signature import (
    ACCESS_KEY,
    SECURITY_TOKEN,
    SIGNATURE,
    UNIQUE_MSG_QUERY_FLAG,
    Signer,
    server_signed_head,
    sign_ext_fields,
    signature_matches,
    signed_head,
)


def test_signature_is_base64_hmac_sha1_of_the_content():
    # printf 'content' | openssl dgst -sha1 -hmac '12345678' -binary | base64
    assert Signer("12345678").sign(b"content") == "1BsW91JsORxjhwjLy6Ma1jP/kow="


def test_content_is_values_in_key_order_then_the_body():
    fields = {"c": "é", "b": "b", "a": "a", SIGNATURE: "ignored"}
    assert signed_head(fields) == "abé".encode()
    # printf 'ab\xc3\xa9body' | openssl dgst -sha1 -hmac 'secret-key' -binary | base64
    assert Signer("secret-key").sign(signed_head(fields), b"body") == (
        "yZxws0n4NRFfML+xxzX7Adt2oNE="
    )


def test_keys_sort_as_java_strings_upper_case_first():
    fields = {"topic": "T", "AccessKey": "ak", "a": "pg", "SecurityToken": "tok"}
    assert signed_head(fields) == b"aktokpgT"


def test_the_server_leaves_out_the_unique_key_query_flag():
    fields = {"topic": "T", UNIQUE_MSG_QUERY_FLAG: "true", SIGNATURE: "x"}
    assert server_signed_head(fields) == b"T"
    assert signed_head(fields) == b"trueT"


def test_signed_fields_verify_and_any_change_breaks_them():
    signer = Signer("secret-key-1")
    fields = {"b": "Orders", "a": "pg"}
    sign_ext_fields(fields, b"payload", "access-key", signer, security_token="tok")
    assert fields[ACCESS_KEY] == "access-key" and fields[SECURITY_TOKEN] == "tok"
    expected = signer.sign(server_signed_head(fields), b"payload")
    assert signature_matches(expected, fields[SIGNATURE])
    # signing again (a retry) gives the same signature: the old one is not signed over
    before = fields[SIGNATURE]
    sign_ext_fields(fields, b"payload", "access-key", signer, security_token="tok")
    assert fields[SIGNATURE] == before
    assert not signature_matches(signer.sign(server_signed_head(fields), b"payloaD"), before)
    assert not signature_matches(Signer("other-key-2").sign(server_signed_head(fields),
                                                            b"payload"), before)
    assert not signature_matches(expected, None)
    assert not signature_matches(expected, "garbled\udcff")


def test_non_ascii_keys_sort_by_utf16_code_units_like_java():
    # U+FF21 sorts before U+1F600 by code point but after it by UTF-16 code unit (U+1F600
    # is 0xD83D 0xDE00), which is Java's order; ASCII keys mixed in sort as usual.
    fields = {"\U0001F600": "3", "\uFF21": "4", "b": "2", "A": "1"}
    assert signed_head(fields) == b"1234"
