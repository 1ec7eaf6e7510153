"""SQL92 filter grammar: every construct, precedence, literals, comments, and errors that
name the position and what was expected (RocketMQ's SelectorParser, docs/protocol.md §9.3)."""

from __future__ import annotations

import pytest

from tidemq.errors import SqlFilterError
from tidemq.filter.sql92 import (
    SQL92_EXPRESSION_LENGTH_MAX,
    SQL92_NESTING_DEPTH_MAX,
    compile_sql92,
)


def matches(expression: str, **properties: str) -> bool:
    return compile_sql92(expression).matches(properties)


def value(expression: str, **properties: str):
    return compile_sql92(expression).evaluate(properties)


@pytest.mark.parametrize("expression, properties, expected", [
    ("a = 'x'", {"a": "x"}, True),
    ("a <> 'x'", {"a": "y"}, True),
    ("a > 5", {"a": "6"}, True),
    ("a >= 5", {"a": "5"}, True),
    ("a < 5", {"a": "4"}, True),
    ("a <= 5", {"a": "6"}, False),
    ("a BETWEEN 1 AND 3", {"a": "3"}, True),
    ("a NOT BETWEEN 1 AND 3", {"a": "4"}, True),
    ("a IN ('x', 'y')", {"a": "y"}, True),
    ("a NOT IN ('x', 'y')", {"a": "z"}, True),
    ("a IS NULL", {}, True),
    ("a IS NOT NULL", {"a": ""}, True),
    ("a = 'x' AND b = 'y'", {"a": "x", "b": "y"}, True),
    ("a = 'x' OR b = 'y'", {"b": "y"}, True),
    ("NOT (a = 'x')", {"a": "y"}, True),
    ("a > -5", {"a": "-4"}, True),
    ("a > +5", {"a": "6"}, True),
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("NULL", {}, False),
])
def test_every_operator_and_keyword(expression, properties, expected):
    assert compile_sql92(expression).matches(properties) is expected


def test_keywords_are_case_insensitive_and_identifiers_are_not():
    assert matches("a between 1 and 3 And b iS nOt NuLl", a="2", b="x")
    assert matches("Region = 'eu'", Region="eu")
    assert not matches("Region = 'eu'", region="eu")


def test_identifiers_take_letters_digits_underscore_and_dollar():
    assert matches("_a$1 = 'v' AND $x = 'w'", _a_1="no", **{"_a$1": "v", "$x": "w"})


def test_and_binds_tighter_than_or():
    # a OR (b AND c)
    assert matches("a = '1' OR b = '1' AND c = '1'", a="1", b="0", c="0")
    assert not matches("(a = '1' OR b = '1') AND c = '1'", a="1", b="0", c="0")


def test_not_binds_tighter_than_a_comparison_as_in_rocketmq():
    # NOT a = 'x' is (NOT a) = 'x': a string property cast to a condition is FALSE,
    # NOT FALSE is TRUE, and TRUE = 'x' is false ('x' is not "true").
    assert not matches("NOT a = 'x'", a="y")
    assert matches("NOT (a = 'x')", a="y")


def test_comparison_binds_tighter_than_equality():
    # (a > 5) = TRUE
    assert matches("a > 5 = TRUE", a="6")
    assert not matches("a > 5 = TRUE", a="4")


def test_string_literals_double_a_quote_to_escape_it_and_may_span_lines():
    assert matches("a = 'it''s'", a="it's")
    assert matches("a = ''", a="")
    assert matches("a = 'two\nlines'", a="two\nlines")


@pytest.mark.parametrize("literal, expected", [
    ("0", 0), ("42", 42), ("42L", 42), ("42l", 42), ("9223372036854775807", 2**63 - 1),
    ("1.5", 1.5), ("5.", 5.0), (".5", 0.5), ("5E2", 500.0), ("1.5e-1", 0.15),
    ("2.5E+1", 25.0), ("0.0", 0.0),
])
def test_number_literals(literal, expected):
    assert value(f"{literal} = n", n=str(expected)) is True


def test_integer_literal_beyond_64_bits_is_refused():
    with pytest.raises(SqlFilterError, match="64-bit") as caught:
        compile_sql92("a > 9223372036854775808")
    assert caught.value.position == 4


def test_comments_are_skipped():
    assert matches("a = 'x' -- the region\nAND b = 'y'", a="x", b="y")
    assert matches("a /* inline, * and / inside */ = 'x'", a="x")
    assert matches("a = 'x' -- a comment may end the text", a="x")
    assert matches("/**/a = 'x'/***/", a="x")


def test_whitespace_forms_are_skipped():
    assert matches("\ta\r\n=\f'x' ", a="x")


def test_long_or_chains_and_in_lists_do_not_nest():
    chain = " OR ".join(f"a = '{i}'" for i in range(1000))
    assert matches(chain, a="999")
    in_list = "a IN (" + ", ".join(f"'{i}'" for i in range(2000)) + ")"
    assert matches(in_list, a="1500")


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("expression, position, expected_words", [
    ("", 0, "condition"),
    ("a >", 3, "property name, a literal"),
    ("a = 'x' b", 8, "AND, OR"),
    ("(a = 'x'", 8, "')'"),
    ("a BETWEEN 1 3", 12, "AND between"),
    ("a IN 'x'", 5, "'('"),
    ("a IN ('x' 'y')", 10, "')'"),
    ("a IN (1)", 6, "string literal"),
    ("a IS 'x'", 5, "NULL"),
    ("a = 007", 5, "AND, OR"),
    ("a ! b", 2, "operator"),
    ("a = 'open", 4, "closing quote"),
    ("a = 1 /* open", 6, "*/"),
    ("a.b = 1", 1, "the character '.'"),
])
def test_syntax_errors_name_the_position_and_what_was_expected(
    expression, position, expected_words
):
    with pytest.raises(SqlFilterError) as caught:
        compile_sql92(expression)
    error = caught.value
    assert error.position == position, str(error)
    assert expected_words in str(error)
    assert f"position {position}" in str(error)


@pytest.mark.parametrize("expression, position, words", [
    ("a > 'x'", 4, "cannot be compared with >"),
    ("'x' <= a", 0, "cannot be compared with <="),
    ("a > TRUE", 4, "cannot be compared with >"),
    ("a >= NULL", 5, "cannot be compared"),
    ("(a = 1) > 2", 1, "condition"),
    ("a = NULL", 4, "IS NULL"),
    ("NULL <> a", 0, "IS NULL"),
    ("TRUE = 1", 0, "cannot be compared with 1"),
    ("a BETWEEN 3 AND 1", 10, "lower bound"),
    ("a BETWEEN NULL AND 1", 10, "cannot be NULL"),
    ("a BETWEEN 'a' AND 'b'", 10, "cannot be compared"),
    ("'x' IN ('x')", 0, "property on its left"),
    ("5", 0, "not a condition"),
    ("'x'", 0, "not a condition"),
    ("-a", 0, "not a condition"),
    ("a = 1 AND 5", 10, "not a condition"),
    ("NOT 5", 4, "not a condition"),
])
def test_illegal_constructs_are_refused_as_rocketmq_refuses_them(expression, position, words):
    with pytest.raises(SqlFilterError) as caught:
        compile_sql92(expression)
    assert caught.value.position == position, str(caught.value)
    assert words in str(caught.value)


def test_legal_mixed_constants_parse():
    # RocketMQ only refuses a boolean constant on the left of a non-boolean constant.
    assert not matches("1 = TRUE")
    assert matches("a = -5", a="-5")
    assert matches("a BETWEEN -5 AND 5", a="0")


def test_expression_longer_than_the_limit_is_refused_before_parsing():
    text = "a = '" + "x" * SQL92_EXPRESSION_LENGTH_MAX + "'"
    with pytest.raises(SqlFilterError, match="SQL92_EXPRESSION_LENGTH_MAX"):
        compile_sql92(text)


@pytest.mark.parametrize("hostile", [
    "(" * 50_000,
    "(" * (SQL92_NESTING_DEPTH_MAX + 1) + "a = 1" + ")" * (SQL92_NESTING_DEPTH_MAX + 1),
    "NOT " * 4000 + "a",
    "- " * 8000 + "a = 1",
    "a" + " IS NULL" * 2000,
    "a = 1" + " = TRUE" * 2000,
])
def test_deep_nesting_is_an_error_not_a_recursion_error(hostile):
    with pytest.raises(SqlFilterError, match="SQL92"):
        compile_sql92(hostile[:SQL92_EXPRESSION_LENGTH_MAX])


def test_nesting_up_to_the_limit_is_fine():
    depth = SQL92_NESTING_DEPTH_MAX - 2
    assert matches("(" * depth + "a = 'x'" + ")" * depth, a="x")


def test_compiled_expressions_are_shared_by_text():
    assert compile_sql92("a = 'cached'") is compile_sql92("a = 'cached'")


def test_a_cached_error_is_raised_again_each_time():
    for _ in range(2):
        with pytest.raises(SqlFilterError):
            compile_sql92("a = ")


def test_properties_read_are_listed():
    assert compile_sql92("a = 'x' AND (b > 1 OR c IN ('y'))").properties == {"a", "b", "c"}
