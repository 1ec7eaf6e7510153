"""SQL92 property filters, as RocketMQ 4.x brokers evaluate them (docs/protocol.md §9.3).

``compile_sql92("region = 'eu' AND amount > 100")`` parses an expression once into a
``SqlExpression`` whose ``matches(properties)`` says whether a message with these properties
(all of them, TAGS and the other system ones included, as strings) is delivered.

Theory of operation
-------------------
``sql92_lexer`` cuts the text into tokens; a recursive-descent parser follows RocketMQ's
grammar (``SelectorParser.jj``), lowest precedence first::

    expression  := and ( OR and )*
    and         := equality ( AND equality )*
    equality    := comparison ( '=' comparison | '<>' comparison | IS NULL | IS NOT NULL )*
    comparison  := unary ( ('>' | '>=' | '<' | '<=') unary
                         | [NOT] BETWEEN unary AND unary
                         | [NOT] IN '(' string ( ',' string )* ')' )*
    unary       := '+' unary | '-' unary | NOT unary | primary
    primary     := literal | property | '(' expression ')'

Note that NOT binds tighter than any comparison, as in RocketMQ: ``NOT a = 'x'`` is
``(NOT a) = 'x'``; write ``NOT (a = 'x')``.

Each rule returns a ``_Node``: a closure ``evaluate(properties) -> value`` plus what the
parser's checks need (is it a constant, a boolean expression, a property?). No text is ever
handed to ``eval``. RocketMQ's build-time checks are kept, so an expression RocketMQ refuses
is refused here with the same reason, and a position:

- ``>``, ``>=``, ``<``, ``<=``, BETWEEN take numbers: a string, TRUE/FALSE/NULL literal or a
  condition as their operand is an error (``a > 'x'``);
- ``=``/``<>`` refuse a NULL literal (use IS NULL) and ``TRUE = 1``-style constant pairs;
- BETWEEN's bounds must not be NULL, and the lower not above the upper;
- IN takes a property on its left and string literals in its list;
- AND, OR, NOT and the whole expression take conditions; a bare property is a condition
  that is true only for a boolean value, which a string property never is.

Evaluation is RocketMQ's three-valued logic: a missing property is NULL; a comparison with
NULL is NULL (except ``'x' = a``, which is false, as in RocketMQ); NOT NULL is NULL; AND is
false when either side is false, else NULL when either is NULL; OR likewise with true. Only
a result of TRUE delivers the message. Comparing values of different types converts one
side (``sql92_values``); a conversion that fails (``amount > 5`` with amount ``"lots"``) makes
the whole expression not match, as the RocketMQ broker's exception handler does.

Limits (checked while parsing, so no input can exhaust the stack): the expression's length
(``SQL92_EXPRESSION_LENGTH_MAX``) and its nesting depth (``SQL92_NESTING_DEPTH_MAX``).
Chains of AND / OR are evaluated as one flat list, so ``a=1 OR a=2 OR ...`` does not nest.

Differences from RocketMQ, both deliberate: a float literal of 0 (``0.0``) is accepted
(RocketMQ's range check refuses it by mistake), and a ``--`` comment may end the text.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tidemq.errors import SqlFilterError
from tidemq.filter.sql92_lexer import (
    END,
    FLOAT,
    IDENTIFIER,
    INTEGER,
    KEYWORD,
    OPERATOR,
    STRING,
    Token,
    tokenize,
)
from tidemq.filter.sql92_values import (
    INT64_MAX,
    EvaluationFailed,
    Value,
    java_compare,
    java_double,
)

# RocketMQ sets no bound; the expression travels in every heartbeat (every 30 s, to every
# broker) and in pull headers, and is kept per group. 16 KiB holds an IN list of a thousand
# ids while keeping a heartbeat small.
SQL92_EXPRESSION_LENGTH_MAX = 16 * 1024

# Parentheses, NOT / sign prefixes and = chains, nested. Real filters nest a handful of
# levels; 64 keeps the parser (about 6 Python frames per level) and the evaluator far from
# Python's default recursion limit of 1000, whoever calls them.
SQL92_NESTING_DEPTH_MAX = 64

# Compiled expressions by text, shared by every group (RocketMQ's SelectorParser keeps 100).
_COMPILE_CACHE_SIZE = 256

Properties = Mapping[str, str]
Evaluate = Callable[[Properties], Value]

# Node kinds: what RocketMQ's build-time checks look at.
_CONSTANT = "constant"  # a string or number literal
_BOOLEAN_CONSTANT = "boolean constant"  # TRUE, FALSE, NULL
_PROPERTY = "property"
_CONDITION = "condition"  # comparison, AND/OR/NOT, IN, IS NULL: TRUE, FALSE or NULL
_NUMBER = "number"  # a sign applied to something: a number or NULL


@dataclass(frozen=True, slots=True)
class _Node:
    kind: str
    evaluate: Evaluate
    text: str  # as written, for error messages
    position: int
    depth: int = 1
    value: Value = None  # for the two constant kinds
    name: str = ""  # for a property


class SqlExpression:
    """A compiled SQL92 filter; immutable and safe to share between groups and tasks.

    Attributes:
        text: the expression as given.
        properties: the property names it reads.
    """

    __slots__ = ("_evaluate", "properties", "text")

    def __init__(self, text: str, evaluate: Evaluate, properties: frozenset[str]) -> None:
        self.text = text
        self.properties = properties
        self._evaluate = evaluate

    def evaluate(self, properties: Properties) -> Value:
        """The expression's value for a message: True, False or None (NULL).

        Raises:
            EvaluationFailed: a conversion RocketMQ would throw on (see ``sql92_values``).
        """
        return self._evaluate(properties)

    def matches(self, properties: Properties) -> bool:
        """True when a message with these properties is delivered: the value is TRUE.

        NULL, FALSE and a failed conversion all mean "not delivered", never an exception.
        """
        try:
            return self._evaluate(properties) is True
        except EvaluationFailed:
            return False

    def __repr__(self) -> str:
        return f"SqlExpression({self.text!r})"


def compile_sql92(expression: str) -> SqlExpression:
    """Parse ``expression`` into a ``SqlExpression`` (cached by text).

    Raises:
        SqlFilterError: a syntax error, an illegal construct or a broken limit; the message
            names the position, what was found and what was expected there.
    """
    outcome = _compile_cached(expression)
    if isinstance(outcome, SqlFilterError):
        # A fresh copy each time: raising the cached instance would chain tracebacks.
        raise SqlFilterError(
            str(outcome), expression=outcome.expression, position=outcome.position,
            expected=outcome.expected,
        )
    return outcome


@functools.lru_cache(maxsize=_COMPILE_CACHE_SIZE)
def _compile_cached(expression: str) -> SqlExpression | SqlFilterError:
    try:
        return _Parser(expression).parse()
    except SqlFilterError as e:
        return e


# -- the parser -----------------------------------------------------------------------------


class _Parser:
    def __init__(self, expression: str) -> None:
        if not isinstance(expression, str):
            raise SqlFilterError(
                f"SQL92 expression must be a string, got {type(expression).__name__}",
                expression=repr(expression), position=0, expected="a string",
            )
        self.expression = expression
        if len(expression) > SQL92_EXPRESSION_LENGTH_MAX:
            raise SqlFilterError(
                f"SQL92 expression is {len(expression)} characters, longer than the limit "
                f"of {SQL92_EXPRESSION_LENGTH_MAX} (SQL92_EXPRESSION_LENGTH_MAX); shorten it, "
                "e.g. by tagging messages and filtering on the tag",
                expression=expression[:200], position=SQL92_EXPRESSION_LENGTH_MAX,
            )
        self.tokens = tokenize(expression)
        self.index = 0
        self.nesting = 0
        self.properties: set[str] = set()

    # -- token helpers --

    @property
    def token(self) -> Token:
        return self.tokens[self.index]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        if token.kind != END:
            self.index += 1
        return token

    def at(self, kind: str, text: str | None = None) -> bool:
        token = self.tokens[self.index]
        return token.kind == kind and (text is None or token.text == text)

    def at_keyword_pair(self, first: str, second: str) -> bool:
        token = self.tokens[self.index]
        following = self.tokens[min(self.index + 1, len(self.tokens) - 1)]
        return (token.kind == KEYWORD and token.text == first
                and following.kind == KEYWORD and following.text == second)

    def expect(self, kind: str, text: str, expected: str) -> Token:
        if not self.at(kind, text):
            raise self.error_at(self.token, expected)
        return self.advance()

    def error_at(self, token: Token, expected: str) -> SqlFilterError:
        return SqlFilterError(
            f"SQL92 expression {self.expression[:200]!r}: found {token.describe()} at "
            f"position {token.position}; expected {expected}",
            expression=self.expression, position=token.position, expected=expected,
        )

    def illegal(self, node: _Node, problem: str) -> SqlFilterError:
        return SqlFilterError(
            f"SQL92 expression {self.expression[:200]!r}: {problem} (at position "
            f"{node.position})",
            expression=self.expression, position=node.position,
        )

    def span(self, start: int) -> str:
        """The text from ``start`` to the end of the last token consumed."""
        last = self.tokens[self.index - 1] if self.index else self.tokens[0]
        return self.expression[start:last.position + len(last.text)].strip()

    def node(self, kind: str, evaluate: Evaluate, start: int, *children: _Node) -> _Node:
        depth = 1 + max((child.depth for child in children), default=0)
        if depth > SQL92_NESTING_DEPTH_MAX:
            raise self.too_deep(start)
        return _Node(kind, evaluate, self.span(start), start, depth)

    def too_deep(self, position: int) -> SqlFilterError:
        return SqlFilterError(
            f"SQL92 expression nests deeper than {SQL92_NESTING_DEPTH_MAX} levels "
            f"(SQL92_NESTING_DEPTH_MAX) at position {position}; flatten it (a = 1 OR a = 2 "
            "does not nest, nor does IN)",
            expression=self.expression[:200], position=position,
        )

    # -- grammar --

    def parse(self) -> SqlExpression:
        if self.at(END):
            raise self.error_at(self.token, "a condition such as a = 'x'")
        node = self.condition(self.or_expression(), "the expression")
        if not self.at(END):
            raise self.error_at(self.token, "AND, OR, a comparison operator or the end")
        return SqlExpression(self.expression, node.evaluate, frozenset(self.properties))

    def or_expression(self) -> _Node:
        start = self.token.position
        first = self.and_expression()
        if not self.at(KEYWORD, "OR"):
            return first
        operands = [self.condition(first, "OR")]
        while self.at(KEYWORD, "OR"):
            self.advance()
            operands.append(self.condition(self.and_expression(), "OR"))
        return self.node(_CONDITION, _any_true([n.evaluate for n in operands]), start,
                         *operands)

    def and_expression(self) -> _Node:
        start = self.token.position
        first = self.equality()
        if not self.at(KEYWORD, "AND"):
            return first
        operands = [self.condition(first, "AND")]
        while self.at(KEYWORD, "AND"):
            self.advance()
            operands.append(self.condition(self.equality(), "AND"))
        return self.node(_CONDITION, _all_true([n.evaluate for n in operands]), start,
                         *operands)

    def equality(self) -> _Node:
        start = self.token.position
        left = self.comparison()
        while True:
            if self.at(OPERATOR, "="):
                self.advance()
                right = self.comparison()
                left = self.equal(left, right, start, negate=False)
            elif self.at(OPERATOR, "<>"):
                self.advance()
                right = self.comparison()
                left = self.equal(left, right, start, negate=True)
            elif self.at(KEYWORD, "IS"):
                self.advance()
                negate = self.at(KEYWORD, "NOT")
                if negate:
                    self.advance()
                self.expect(KEYWORD, "NULL", "NULL (IS NULL / IS NOT NULL)")
                left = self.node(_CONDITION, _is_null(left.evaluate, negate), start, left)
            else:
                return left

    def equal(self, left: _Node, right: _Node, start: int, *, negate: bool) -> _Node:
        operator = "<>" if negate else "="
        for side in (left, right):
            if side.kind == _BOOLEAN_CONSTANT and side.value is None:
                raise self.illegal(side, f"NULL cannot be compared with {operator}; use "
                                         "IS NULL or IS NOT NULL")
        if left.kind == _BOOLEAN_CONSTANT and right.kind == _CONSTANT:
            raise self.illegal(left, f"{left.text} cannot be compared with {right.text}")
        return self.node(_CONDITION, _equal(left.evaluate, right.evaluate, negate), start,
                         left, right)

    def comparison(self) -> _Node:
        start = self.token.position
        left = self.unary()
        while True:
            token = self.token
            if token.kind == OPERATOR and token.text in _ORDER_TESTS:
                self.advance()
                right = self.unary()
                left = self.order(left, right, token.text, start)
            elif self.at(KEYWORD, "BETWEEN"):
                self.advance()
                left = self.between(left, start, negate=False)
            elif self.at_keyword_pair("NOT", "BETWEEN"):
                self.index += 2
                left = self.between(left, start, negate=True)
            elif self.at(KEYWORD, "IN"):
                self.advance()
                left = self.in_list(left, start, negate=False)
            elif self.at_keyword_pair("NOT", "IN"):
                self.index += 2
                left = self.in_list(left, start, negate=True)
            else:
                return left

    def order(self, left: _Node, right: _Node, operator: str, start: int) -> _Node:
        self.check_number_operand(left, operator)
        self.check_number_operand(right, operator)
        return self.node(_CONDITION, _order(left.evaluate, right.evaluate, operator), start,
                         left, right)

    def check_number_operand(self, node: _Node, operator: str) -> None:
        if node.kind == _CONSTANT and type(node.value) in (int, float):
            return
        if node.kind in (_CONSTANT, _BOOLEAN_CONSTANT):
            raise self.illegal(node, f"{node.text} cannot be compared with {operator}: it "
                                     "takes numbers (a property holding a number, or a "
                                     "number literal)")
        if node.kind == _CONDITION:
            raise self.illegal(node, f"the condition {node.text} cannot be compared with "
                                     f"{operator}; put it in parentheses with AND/OR instead")

    def between(self, value: _Node, start: int, *, negate: bool) -> _Node:
        low = self.unary()
        self.expect(KEYWORD, "AND", "AND between the two bounds of BETWEEN")
        high = self.unary()
        constants = (_CONSTANT, _BOOLEAN_CONSTANT)
        if low.kind in constants and high.kind in constants:
            if low.value is None or high.value is None:
                raise self.illegal(low if low.value is None else high,
                                   "the bounds of BETWEEN cannot be NULL")
            try:
                backwards = java_compare(high.value, low.value) < 0
            except EvaluationFailed as e:
                raise self.illegal(low, f"the bounds of BETWEEN cannot be compared: {e}") \
                    from None
            if backwards:
                raise self.illegal(low, f"the lower bound of BETWEEN ({low.text}) must not be "
                                        f"above the upper bound ({high.text})")
        if negate:  # value < low OR value > high
            below = self.order(value, low, "<", start)
            above = self.order(value, high, ">", start)
            return self.node(_CONDITION, _any_true([below.evaluate, above.evaluate]), start,
                             below, above)
        at_least = self.order(value, low, ">=", start)
        at_most = self.order(value, high, "<=", start)
        return self.node(_CONDITION, _all_true([at_least.evaluate, at_most.evaluate]), start,
                         at_least, at_most)

    def in_list(self, left: _Node, start: int, *, negate: bool) -> _Node:
        if left.kind != _PROPERTY:
            raise self.illegal(left, f"IN needs a property on its left, got {left.text}")
        self.expect(OPERATOR, "(", "'(' to open the IN list")
        values = [self.string_literal()]
        while self.at(OPERATOR, ","):
            self.advance()
            values.append(self.string_literal())
        self.expect(OPERATOR, ")", "',' and another string, or ')' to close the IN list")
        return self.node(_CONDITION, _in(left.name, frozenset(values), negate), start, left)

    def string_literal(self) -> str:
        if not self.at(STRING):
            raise self.error_at(self.token, "a string literal in quotes (IN lists hold "
                                            "strings only)")
        return _string_value(self.advance().text)

    def unary(self) -> _Node:
        token = self.token
        if (token.kind == OPERATOR and token.text in ("+", "-")) or self.at(KEYWORD, "NOT"):
            self.nesting += 1
            if self.nesting > SQL92_NESTING_DEPTH_MAX:
                raise self.too_deep(token.position)
            self.advance()
            operand = self.unary()
            self.nesting -= 1
            if token.text == "+":
                return operand
            if token.text == "-":
                return self.node(_NUMBER, _negate(operand.evaluate), token.position, operand)
            operand = self.condition(operand, "NOT")
            return self.node(_CONDITION, _not(operand.evaluate), token.position, operand)
        return self.primary()

    def primary(self) -> _Node:
        token = self.token
        if token.kind == OPERATOR and token.text == "(":
            self.nesting += 1
            if self.nesting > SQL92_NESTING_DEPTH_MAX:
                raise self.too_deep(token.position)
            self.advance()
            inner = self.or_expression()
            self.expect(OPERATOR, ")", "')' to close the '(' at position "
                                       f"{token.position}, or AND/OR/a comparison")
            self.nesting -= 1
            return inner
        if token.kind == IDENTIFIER:
            self.advance()
            name = token.text
            self.properties.add(name)
            return _Node(_PROPERTY, _property(name), name, token.position, name=name)
        if token.kind == STRING:
            self.advance()
            value = _string_value(token.text)
            return _Node(_CONSTANT, _constant(value), token.text, token.position, value=value)
        if token.kind == INTEGER:
            self.advance()
            digits = token.text.rstrip("lL")
            number = int(digits)
            if number > INT64_MAX:
                raise self.illegal(
                    _Node(_CONSTANT, _constant(None), token.text, token.position),
                    f"{token.text} is out of the 64-bit integer range (at most {INT64_MAX})",
                )
            return _Node(_CONSTANT, _constant(number), token.text, token.position, value=number)
        if token.kind == FLOAT:
            self.advance()
            number = float(token.text)
            if number == float("inf"):
                raise self.illegal(
                    _Node(_CONSTANT, _constant(None), token.text, token.position),
                    f"{token.text} is out of the double range",
                )
            return _Node(_CONSTANT, _constant(number), token.text, token.position, value=number)
        if token.kind == KEYWORD and token.text in _BOOLEAN_LITERALS:
            self.advance()
            literal = _BOOLEAN_LITERALS[token.text]
            return _Node(_BOOLEAN_CONSTANT, _constant(literal), token.text, token.position,
                         value=literal)
        raise self.error_at(token, "a property name, a literal ('text', 12, 1.5, TRUE, FALSE, "
                                   "NULL), '(' or NOT")

    def condition(self, node: _Node, where: str) -> _Node:
        """RocketMQ's asBooleanExpression: conditions pass, a property is cast, else error."""
        if node.kind in (_CONDITION, _BOOLEAN_CONSTANT):
            return node
        if node.kind == _PROPERTY:
            return _Node(_CONDITION, _boolean_cast(node.name), node.text, node.position,
                         node.depth + 1)
        raise self.illegal(node, f"{node.text} is not a condition, so it cannot be the operand "
                                 f"of {where}; compare it (e.g. {node.text} = ...)")


_BOOLEAN_LITERALS: dict[str, Value] = {"TRUE": True, "FALSE": False, "NULL": None}


def _string_value(text: str) -> str:
    return text[1:-1].replace("''", "'")


# -- evaluators (closures; each returns True, False, None or a plain value) --------------------


def _constant(value: Value) -> Evaluate:
    return lambda properties: value


def _property(name: str) -> Evaluate:
    return lambda properties: properties.get(name)


def _boolean_cast(name: str) -> Evaluate:
    def evaluate(properties: Properties) -> Value:
        value = properties.get(name)
        if value is None:
            return None
        return value if type(value) is bool else False

    return evaluate


def _negate(operand: Evaluate) -> Evaluate:
    def evaluate(properties: Properties) -> Value:
        value = operand(properties)
        if type(value) in (int, float):
            return -value  # type: ignore[operator]
        return None

    return evaluate


def _not(operand: Evaluate) -> Evaluate:
    def evaluate(properties: Properties) -> Value:
        value = operand(properties)
        return None if value is None else not value

    return evaluate


def _any_true(operands: list[Evaluate]) -> Evaluate:
    def evaluate(properties: Properties) -> Value:
        unknown = False
        for operand in operands:
            value = operand(properties)
            if value is True:
                return True
            if value is None:
                unknown = True
        return None if unknown else False

    return evaluate


def _all_true(operands: list[Evaluate]) -> Evaluate:
    def evaluate(properties: Properties) -> Value:
        unknown = False
        for operand in operands:
            value = operand(properties)
            if value is False:
                return False
            if value is None:
                unknown = True
        return None if unknown else True

    return evaluate


def _equal(left: Evaluate, right: Evaluate, negate: bool) -> Evaluate:
    def evaluate(properties: Properties) -> Value:
        left_value = left(properties)
        right_value = right(properties)
        if left_value is None or right_value is None:
            if left_value is None and right_value is None:
                equal: Value = True
            elif left_value is None:
                equal = None
            else:
                equal = False  # RocketMQ: 'x' = missing is false, missing = 'x' is NULL
        elif type(left_value) is type(right_value) and type(left_value) is not float:
            equal = left_value == right_value
        else:
            equal = java_compare(left_value, right_value) == 0
        if negate and equal is not None:
            return not equal
        return equal

    return evaluate


def _is_null(operand: Evaluate, negate: bool) -> Evaluate:
    return lambda properties: (operand(properties) is None) != negate


_ORDER_TESTS: dict[str, Callable[[int], bool]] = {
    ">": lambda answer: answer > 0,
    ">=": lambda answer: answer >= 0,
    "<": lambda answer: answer < 0,
    "<=": lambda answer: answer <= 0,
}


def _order(left: Evaluate, right: Evaluate, operator: str) -> Evaluate:
    test = _ORDER_TESTS[operator]

    def evaluate(properties: Properties) -> Value:
        left_value = left(properties)
        if left_value is None:
            return None
        right_value = right(properties)
        if right_value is None:
            return None
        if type(left_value) is str and type(right_value) is str:
            # RocketMQ: two strings are compared as doubles, or the evaluation fails.
            return test(java_compare(java_double(left_value), java_double(right_value)))
        return test(java_compare(left_value, right_value))

    return evaluate


def _in(name: str, values: frozenset[str], negate: bool) -> Evaluate:
    def evaluate(properties: Properties) -> Value:
        value = properties.get(name)
        if type(value) is not str:
            return None
        return (value in values) != negate

    return evaluate
