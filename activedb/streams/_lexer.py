"""The lexer of the textual language (tokens; names like ``HCW-ID``; ``"quoted"`` names;
``--`` comments) and :class:`TokenCursor`, the parser's token helpers.  The language is in the
design note ``activedb/streams/README.md``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

_Item = TypeVar("_Item")

from activedb.errors import finite_number
from activedb.streams import algebra as ast
from activedb.streams.errors import QuerySyntaxError

DURATION_UNITS = {
    "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001, "msec": 0.001,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "day": 86400.0, "days": 86400.0,
}


@dataclass(frozen=True)
class Token:
    kind: str          # name | quoted | string | number | symbol | end
    text: str
    value: Any
    line: int
    column: int

    def is_keyword(self, *words: str) -> bool:
        return self.kind == "name" and self.text.upper() in words

    def describe(self) -> str:
        if self.kind == "end":
            return "the end of the text"
        if self.kind == "string":
            return f"the string {self.text}"
        return f"{self.text!r}"


# One token (or a newline, space or comment) at a position: the first alternative that matches.  A name
# is a letter or _, then letters, digits and _, where a - followed by a letter continues it (HCW-ID).
_TOKEN = re.compile(r"(?P<newline>\n)|(?P<space>\s)|(?P<comment>--.*)|(?P<name>[^\W\d]\w*(?:-(?=[^\W\d_])\w*)*)"
                    r"|(?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(?P<symbol>!=|<>|<=|>=|[(),.;\[\]!=<>+\-*/])")
# A string ('…') or quoted name ("…"): a doubled quote stands for one; group 2 is None if unterminated.
_QUOTED = {quote: re.compile(f"{quote}((?:[^{quote}\\n]|{quote}{quote})*)({quote})?") for quote in "'\""}


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    index, line, line_start = 0, 1, 0
    while index < len(text):
        column = index - line_start + 1
        char = text[index]
        if char in _QUOTED:
            quote, match = char, _QUOTED[char].match(text, index)
            assert match is not None    # (the pattern matches the empty string)
            if match.group(2) is None:
                what = "string" if quote == "'" else "quoted name"
                where = " before the end of the line" if match.end() < len(text) else ""
                raise QuerySyntaxError(f"unterminated {what}: add the closing {quote}{where}", line=line,
                                       column=column, text=text)
            index = match.end()
            value = match.group(1).replace(quote * 2, quote)
            tokens.append(Token("string" if quote == "'" else "quoted", match.group(), value, line, column))
            continue
        match = _TOKEN.match(text, index)
        if match is None:
            raise QuerySyntaxError(f"unexpected character {char!r}", line=line, column=column, text=text)
        kind, word, index = match.lastgroup, match.group(), match.end()
        if kind == "newline":
            line, line_start = line + 1, index
        elif kind == "number":
            value = float(word) if any(mark in word for mark in ".eE") else int(word)
            tokens.append(Token("number", word, value, line, column))
        elif kind in ("name", "symbol"):
            tokens.append(Token(kind, word, word, line, column))
    tokens.append(Token("end", "", None, line, index - line_start + 1))
    return tokens


RESERVED = frozenset({
    "AND", "OR", "NOT", "SELECT", "FROM", "WHERE", "WITHIN", "RETURN", "PATTERN", "ON", "CREATE", "QUERY",
    "RULE", "BEGIN", "END", "WHEN", "AS", "IS", "NULL", "TRUE", "FALSE", "EXISTS", "MATCHING", "PRIORITY",
    "CONSUMING", "REFERENCING", "FOR", "UPDATE", "INSERT", "DELETE", "SET", "VALUES", "INTO",
})


class TokenCursor:
    """The tokens of one text and a position in them: what the parser looks at, accepts and
    expects; errors carry the line and column of the token at fault."""

    def __init__(self, text: str):
        self.text = text
        self.tokens = tokenize(text)
        self.index = 0

    @property
    def current(self) -> Token:
        return self.tokens[self.index]

    def peek(self, offset: int = 1) -> Token:
        return self.tokens[min(self.index + offset, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        if token.kind != "end":
            self.index += 1
        return token

    def error(self, message: str, token: Token | None = None) -> QuerySyntaxError:
        token = token or self.current
        return QuerySyntaxError(message, line=token.line, column=token.column, text=self.text)

    def position(self, token: Token | None = None) -> ast.Position:
        token = token or self.current
        return ast.Position(token.line, token.column)

    def at_symbol(self, symbol: str) -> bool:
        return self.current.kind == "symbol" and self.current.text == symbol

    def accept_symbol(self, symbol: str) -> bool:
        if self.at_symbol(symbol):
            self.advance()
            return True
        return False

    def expect_symbol(self, symbol: str, what: str) -> Token:
        if not self.at_symbol(symbol):
            raise self.error(f"expected {symbol!r} {what}, found {self.current.describe()}")
        return self.advance()

    def accept_keyword(self, *words: str) -> Token | None:
        if self.current.is_keyword(*words):
            return self.advance()
        return None

    def expect_keyword(self, word: str, what: str) -> Token:
        if not self.current.is_keyword(word):
            raise self.error(f"expected {word} {what}, found {self.current.describe()}")
        return self.advance()

    def name(self, what: str) -> str:
        token = self.current
        if token.kind == "quoted" or (token.kind == "name" and token.text.upper() not in RESERVED):
            value: str = self.advance().value   # a name's value is its text, a quoted name's without the quotes
            return value
        if token.kind == "name":
            raise self.error(f"expected {what}, found the keyword {token.text.upper()} "
                             f"(write it in double quotes to use it as a name)")
        raise self.error(f"expected {what}, found {token.describe()}")

    def number(self, what: str) -> float | int:
        """A number literal, optionally negated, that is finite as a float (``1e999`` reads as infinity, an integer
        of 400 digits converts to none)."""
        negative = self.accept_symbol("-")
        token = self.current
        if token.kind != "number":
            raise self.error(f"expected {what} (a number), found {token.describe()}")
        if not finite_number(token.value):     # (inf, or an int too large for a float)
            raise self.error(f"expected {what} (a finite number), found {token.text}, which is infinite as a float: "
                             f"give a number below 1e308")
        self.advance()
        number: float | int = -token.value if negative else token.value
        return number

    def comma_list(self, item: Callable[[], _Item]) -> tuple[_Item, ...]:
        """``item { "," item }``."""
        items = [item()]
        while self.accept_symbol(","):
            items.append(item())
        return tuple(items)
