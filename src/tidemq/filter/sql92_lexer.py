"""Tokens of RocketMQ's SQL92 filter language (docs/protocol.md §9.3; RocketMQ's
``SelectorParser.jj``, 4.x: no CONTAINS / STARTSWITH / ENDSWITH).

The token rules, each matched at the current position, longest alternative first:

    whitespace      space, tab, CR, LF, form feed                 (skipped)
    line comment    ``--`` up to the end of the line              (skipped)
    block comment   ``/* ... */`` (unterminated: an error)        (skipped)
    FLOAT           ``1.5``  ``5.``  ``.5``  ``5E3``  ``1.5e-3``  (exponent marker e or E)
    INTEGER         ``0`` or a digit 1-9 then digits, optional ``L``/``l`` (``007`` is three
                    tokens and so a syntax error, as in RocketMQ)
    STRING          ``'...'``, ``''`` inside stands for one quote; may span lines
    identifier      a letter, ``_`` or ``$``, then letters, digits, ``_``, ``$`` (ASCII)
    keyword         an identifier spelling NOT AND OR BETWEEN IN TRUE FALSE NULL IS, any case
    operator        ``=  <>  >  >=  <  <=  (  )  ,  +  -``

One deliberate difference: RocketMQ's line comment must end with a line break, so
``a = 1 -- note`` at the very end fails there; here the end of the text also ends it.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tidemq.errors import SqlFilterError

KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"})

# Token kinds.
KEYWORD = "keyword"
IDENTIFIER = "identifier"
INTEGER = "integer"
FLOAT = "float"
STRING = "string"
OPERATOR = "operator"
END = "end"

# One alternation, tried in this order at each position. FLOAT comes before INTEGER so that
# "1.5" is one token; the skipped forms come first so "--" is never two minus signs.
_TOKEN_PATTERN = re.compile(
    r"""
      (?P<space>[ \t\n\r\f]+)
    | (?P<line_comment>--[^\n\r]*(?:\r\n|\n|\r|\Z))
    | (?P<block_comment>/\*.*?\*/)
    | (?P<float>[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?
              | \.[0-9]+(?:[eE][+-]?[0-9]+)?
              | [0-9]+[eE][+-]?[0-9]+)
    | (?P<integer>0|[1-9][0-9]*[lL]?)
    | (?P<string>'(?:''|[^'])*')
    | (?P<word>[A-Za-z_$][A-Za-z0-9_$]*)
    | (?P<operator><>|<=|>=|[=<>(),+-])
    """,
    re.VERBOSE | re.DOTALL,
)


class Token(NamedTuple):
    """One token: its kind, its text as written, and where it starts (0-based)."""

    kind: str
    text: str
    position: int

    def describe(self) -> str:
        """The token as an error message names it."""
        if self.kind == END:
            return "the end of the expression"
        if self.kind == STRING:
            return f"string {self.text[:40]}"
        return f"{self.kind} {self.text[:40]!r}"


def tokenize(expression: str) -> list[Token]:
    """Split ``expression`` into tokens, the last one of kind END.

    Raises:
        SqlFilterError: a character no token can start with, an unterminated string or
            block comment; ``position`` points at it.
    """
    tokens: list[Token] = []
    position = 0
    length = len(expression)
    match = _TOKEN_PATTERN.match
    while position < length:
        found = match(expression, position)
        if found is None:
            raise _lexical_error(expression, position)
        kind = found.lastgroup
        text = found.group()
        if kind == "word":
            upper = text.upper()
            if upper in KEYWORDS:
                tokens.append(Token(KEYWORD, upper, position))
            else:
                tokens.append(Token(IDENTIFIER, text, position))
        elif kind not in ("space", "line_comment", "block_comment"):
            tokens.append(Token(kind or OPERATOR, text, position))
        position = found.end()
    tokens.append(Token(END, "", length))
    return tokens


def _lexical_error(expression: str, position: int) -> SqlFilterError:
    char = expression[position]
    if char == "'":
        what, expected = "a string that is never closed", "a closing quote '"
    elif expression.startswith("/*", position):
        what, expected = "a comment that is never closed", "*/ to close the comment"
    else:
        what = f"the character {char!r}"
        expected = "a property name, a literal, an operator (= <> > >= < <=), '(' or ')'"
    return SqlFilterError(
        f"SQL92 expression {expression[:200]!r}: found {what} at position {position}; "
        f"expected {expected}",
        expression=expression, position=position, expected=expected,
    )
