"""The textual language of Active CEP (§3.1, Appendix B): a recursive-descent parser (one
method per grammar rule) over ``_lexer.py``'s tokens, producing :mod:`algebra` nodes; every
error is a :class:`~activedb.streams.errors.QuerySyntaxError` with line and column.  The
grammar is in the design note ``activedb/streams/README.md``.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable
from typing import Any

from activedb.streams import algebra as ast
from activedb.streams._lexer import DURATION_UNITS, RESERVED, Token, TokenCursor
from activedb.streams.errors import DefinitionError

class Parser(TokenCursor):
    """Parses one text; :meth:`script` returns the definitions in order (one method per
    grammar rule; the token helpers are :class:`~activedb.streams._lexer.TokenCursor`'s)."""

    # --- script ---------------------------------------------------------------------------

    def script(self) -> list[ast.QueryDefinition | ast.RuleDefinition]:
        definitions = []
        while True:
            while self.accept_symbol(";"):
                pass
            if self.current.kind == "end":
                break
            definitions.append(self.statement())
            if self.current.kind != "end" and not self.at_symbol(";") and not self.current.is_keyword("CREATE"):
                raise self.error(f"expected ';' or the next CREATE after the definition, found "
                                 f"{self.current.describe()}")
        if not definitions:
            raise self.error("no definition found: expected CREATE QUERY or CREATE RULE")
        return definitions

    def statement(self) -> ast.QueryDefinition | ast.RuleDefinition:
        start = self.current
        self.expect_keyword("CREATE", "to start a definition")
        replace = False
        if self.accept_keyword("OR"):
            self.expect_keyword("REPLACE", "after CREATE OR")
            replace = True
        if self.accept_keyword("QUERY"):
            if replace:
                raise self.error("CREATE OR REPLACE is for rules; redefine a query with a new name", start)
            return self.query(start)
        if self.accept_keyword("RULE"):
            return self.rule(start, replace)
        raise self.error(f"expected QUERY or RULE after CREATE, found {self.current.describe()}")

    # --- queries --------------------------------------------------------------------------

    def query(self, start: Token) -> ast.QueryDefinition:
        name = self.name("the query's name")
        # Each clause once, in any order: its keyword, the QueryDefinition field and the rule parsing it.
        clauses: dict[str, tuple[str, Callable[[], object]]]
        clauses = {"ON": ("stream", lambda: self.name("the stream's name after ON")),
                   "PATTERN": ("pattern", self.pattern), "WHERE": ("where", self.expression),
                   "WITHIN": ("within", self.duration), "RETURN": ("returns", self.returns),
                   "MATCHING": ("selection", self.selection), "CONSUMING": ("consumption", self.consumption),
                   "PRIORITY": ("priority", lambda: self.number("the query's priority"))}
        fields: dict[str, Any] = {}
        while self.current.is_keyword(*clauses):
            token = self.advance()
            keyword = token.text.upper()
            field, parse_clause = clauses[keyword]
            if field in fields:
                raise self.error(f"{keyword} given twice in query {name}", token)
            fields[field] = parse_clause()
        if "pattern" not in fields:
            raise self.error(f"query {name} needs a PATTERN clause (e.g. PATTERN SEQ(A, !B, C)); "
                             f"found {self.current.describe()}")
        if "returns" not in fields:
            raise self.error(f"query {name} needs a RETURN clause (e.g. RETURN C.id); found "
                             f"{self.current.describe()}")
        return ast.QueryDefinition(name=name, **fields, position=self.position(start))

    def consumption(self) -> ast.Consumption:
        word = self.accept_keyword("CHRONICLE", "RECENT")
        if word is None:
            raise self.error(f"expected CHRONICLE or RECENT after CONSUMING, found {self.current.describe()}")
        return ast.Consumption(word.text.lower())

    def pattern(self) -> ast.Pattern:
        start = self.current
        for keyword, node in (("SEQ", ast.Seq), ("AND", ast.Conj)):
            if self.current.is_keyword(keyword) and self.peek().kind == "symbol" and self.peek().text == "(":
                self.advance()
                self.advance()
                items = self.comma_list(self.component)
                self.expect_symbol(")", f"to close {keyword}(")
                return node(items, position=self.position(start))
        return ast.Seq((self.component(),), position=self.position(start))

    def component(self) -> ast.EventComponent:
        start = self.current
        negated = self.accept_symbol("!")
        event_type = self.name("an event type")
        alias = None
        if self.current.kind in ("name", "quoted") and not self.current.is_keyword(*RESERVED):
            alias = self.name("an alias")
        return ast.EventComponent(event_type, alias, negated, position=self.position(start))

    def duration(self) -> float:
        start = self.current
        amount = self.number("the window's length")
        token = self.current
        if token.kind != "name" or token.text.lower() not in DURATION_UNITS:
            raise self.error(f"expected a time unit after {amount} (ms, sec, min, hour, day), found "
                             f"{token.describe()}")
        self.advance()
        seconds = float(amount) * DURATION_UNITS[token.text.lower()]
        if seconds <= 0:
            raise self.error("WITHIN needs a positive window", start)
        if not math.isfinite(seconds):      # (a finite amount times its unit; start is the amount: it is positive)
            raise self.error(f"WITHIN {start.text} {token.text} is no finite window: give a shorter one", start)
        return seconds

    def returns(self) -> tuple[ast.ReturnItem, ...]:
        return self.comma_list(self.return_item)

    def return_item(self) -> ast.ReturnItem:
        start = self.current
        expression = self.expression()
        if self.accept_keyword("AS"):
            name = self.name("the output attribute's name after AS")
        elif isinstance(expression, ast.AttributeRef):
            name = expression.attribute
        elif isinstance(expression, ast.ColumnRef) and expression.table is None:
            name = expression.column
        else:
            raise self.error("name this RETURN expression with AS (e.g. RETURN a + 1 AS total)", start)
        return ast.ReturnItem(name, expression, position=self.position(start))

    def selection(self) -> ast.Selection:
        self.expect_keyword("SKIP", "in MATCHING SKIP TILL ANY|NEXT MATCH")
        self.expect_keyword("TILL", "in MATCHING SKIP TILL ANY|NEXT MATCH")
        word = self.accept_keyword("ANY", "NEXT")
        if word is None:
            raise self.error(f"expected ANY or NEXT in MATCHING SKIP TILL … MATCH, found {self.current.describe()}")
        self.expect_keyword("MATCH", "to end MATCHING SKIP TILL … MATCH")
        return (ast.Selection.SKIP_TILL_ANY_MATCH if word.text.upper() == "ANY"
                else ast.Selection.SKIP_TILL_NEXT_MATCH)

    # --- rules ----------------------------------------------------------------------------

    def rule(self, start: Token, replace: bool) -> ast.RuleDefinition:
        name = self.name("the rule's name")
        self.expect_keyword("ON", f"after CREATE RULE {name} (rules are ON OUTPUT <query>)")
        self.expect_keyword("OUTPUT", "after ON (rules are ON OUTPUT <query>)")
        query = self.name("the query's name after ON OUTPUT")
        new_alias = "NEW"
        if self.accept_keyword("REFERENCING"):
            self.expect_keyword("NEW", "after REFERENCING")
            self.expect_keyword("AS", "after REFERENCING NEW")
            new_alias = self.name("the name of the new event after REFERENCING NEW AS")
        if self.accept_keyword("FOR"):
            self.expect_keyword("EACH", "after FOR")
            self.expect_keyword("EVENT", "after FOR EACH (rules fire FOR EACH EVENT of the query's output)")
        when = self.expression() if self.accept_keyword("WHEN") else None
        priority = self.number("the rule's priority") if self.accept_keyword("PRIORITY") else None
        if self.accept_keyword("BEGIN"):
            actions = []
            while True:
                while self.accept_symbol(";"):
                    pass
                if self.accept_keyword("END"):
                    break
                if self.current.kind == "end":
                    raise self.error(f"rule {name}: BEGIN without END")
                actions.append(self.action())
                if not self.at_symbol(";") and not self.current.is_keyword("END"):
                    raise self.error(f"expected ';' or END after the action, found {self.current.describe()}")
            if not actions:
                raise self.error(f"rule {name} has an empty BEGIN … END; give it an action")
        else:
            actions = [self.action()]
        return ast.RuleDefinition(name=name, query=query, actions=tuple(actions), new_alias=new_alias, when=when,
                                  priority=priority, replace=replace, position=self.position(start))

    def action(self) -> ast.Action:
        start = self.current
        if self.accept_keyword("UPDATE"):
            table = self.name("the table to UPDATE")
            self.expect_keyword("SET", f"after UPDATE {table}")
            assignments = self.comma_list(self.assignment)
            self.expect_keyword("WHERE", f"in UPDATE {table} (an UPDATE changes one row: WHERE <key> = …)")
            key = self.keys(f"UPDATE {table}")
            return ast.UpdateAction(table, assignments, key, position=self.position(start))
        if self.accept_keyword("INSERT"):
            self.expect_keyword("INTO", "after INSERT")
            table = self.name("the table to INSERT INTO")
            columns: tuple[str, ...] = ()
            if self.accept_symbol("("):
                columns = self.comma_list(lambda: self.name("a column"))
                self.expect_symbol(")", "to close the column list")
            self.expect_keyword("VALUES", f"in INSERT INTO {table}")
            self.expect_symbol("(", "after VALUES")
            values = self.comma_list(self.expression)
            self.expect_symbol(")", "to close VALUES (")
            if columns and len(columns) != len(values):
                raise self.error(f"INSERT INTO {table} names {len(columns)} columns but gives {len(values)} values",
                                 start)
            return ast.InsertAction(table, columns, values, position=self.position(start))
        if self.accept_keyword("DELETE"):
            self.expect_keyword("FROM", "after DELETE")
            table = self.name("the table to DELETE FROM")
            self.expect_keyword("WHERE", f"in DELETE FROM {table} (a DELETE removes one row: WHERE <key> = …)")
            return ast.DeleteAction(table, self.keys(f"DELETE FROM {table}"), position=self.position(start))
        raise self.error(f"expected an action (UPDATE, INSERT or DELETE), found {self.current.describe()}; "
                         f"anything else is a Python action (engine.rule(…, action=function))")

    def assignment(self) -> tuple[str, ast.Expr]:
        column = self.name("a column to SET")
        self.expect_symbol("=", f"after SET {column}")
        return column, self.expression()

    def keys(self, what: str, table: str | None = None) -> tuple[tuple[str, ast.Expr], ...]:
        """``column = expr { AND column = expr }``; in a subquery on ``table``, ``table.column``
        is the column (not an event attribute)."""
        pairs = []
        while True:
            token = self.current
            condition = self.comparison()
            if table is not None:
                condition = _unqualify(condition, table)
            pairs.append(_column_equality(self, condition, token, what))
            if not self.accept_keyword("AND"):
                return tuple(pairs)

    # --- expressions ----------------------------------------------------------------------

    def expression(self) -> ast.Expr:
        return self._junction("OR", self.conjunction, ast.Or)

    def conjunction(self) -> ast.Expr:
        return self._junction("AND", self.negation, ast.And)

    def _junction(self, keyword: str, operand: Callable[[], ast.Expr], node: type) -> ast.Expr:
        """``operand`` once, or ``operand`` ``keyword`` ``operand`` ... as one ``node`` of all of them."""
        start = self.current
        operands = [operand()]
        while self.accept_keyword(keyword):
            operands.append(operand())
        return operands[0] if len(operands) == 1 else node(tuple(operands), position=self.position(start))

    def negation(self) -> ast.Expr:
        start = self.current
        if self.accept_keyword("NOT"):
            return ast.Not(self.negation(), position=self.position(start))
        return self.comparison()

    def comparison(self) -> ast.Expr:
        start = self.current
        left = self.sum()
        token = self.current
        if token.kind == "symbol" and token.text in ("=", "!=", "<>", "<", "<=", ">", ">="):
            self.advance()
            operator = "!=" if token.text == "<>" else token.text
            return ast.Compare(operator, left, self.sum(), position=self.position(start))
        if self.accept_keyword("IS"):
            negated = self.accept_keyword("NOT") is not None
            self.expect_keyword("NULL", "after IS [NOT]")
            return ast.IsNull(left, negated=negated, position=self.position(start))
        return left

    def sum(self) -> ast.Expr:
        return self._arithmetic(("+", "-"), self.product)

    def product(self) -> ast.Expr:
        return self._arithmetic(("*", "/"), self.unary)

    def _arithmetic(self, operators: tuple[str, ...], operand: Callable[[], ast.Expr]) -> ast.Expr:
        """A left-associative chain of ``operand`` parses joined by any of ``operators``."""
        start = self.current
        left = operand()
        while self.current.kind == "symbol" and self.current.text in operators:
            operator = self.advance().text
            left = ast.Arithmetic(operator, left, operand(), position=self.position(start))
        return left

    def unary(self) -> ast.Expr:
        start = self.current
        if self.accept_symbol("-"):
            operand = self.unary()
            if isinstance(operand, ast.Literal) and isinstance(operand.value, (int, float)):
                return ast.Literal(-operand.value, position=self.position(start))
            return ast.Negate(operand, position=self.position(start))
        return self.primary()

    def primary(self) -> ast.Expr:
        token = self.current
        position = self.position(token)
        if token.kind in ("number", "string"):
            self.advance()
            return ast.Literal(token.value, position=position)
        if token.is_keyword("TRUE", "FALSE", "NULL"):
            self.advance()
            return ast.Literal({"TRUE": True, "FALSE": False}.get(token.text.upper()), position=position)
        if token.is_keyword("EXISTS"):
            self.advance()
            self.expect_symbol("(", "after EXISTS")
            select = self.select(token)
            self.expect_symbol(")", "to close EXISTS (SELECT …")
            return ast.Exists(select, position=position)
        if self.accept_symbol("["):
            attribute = self.name("an attribute in [ ] (the equivalence test)")
            self.expect_symbol("]", f"to close [{attribute}")
            return ast.Equivalence(attribute, position=position)
        if self.accept_symbol("("):
            if self.current.is_keyword("SELECT"):
                select = self.select(token)
                self.expect_symbol(")", "to close (SELECT …")
                if select.column is None:
                    raise self.error("a scalar subquery selects one column, not *; use EXISTS (SELECT * …) to "
                                     "test for a row", token)
                return ast.ScalarSubquery(select, position=position)
            inner = self.expression()
            self.expect_symbol(")", "to close the parenthesis")
            return inner
        if token.kind in ("name", "quoted"):
            first = self.name("a name")
            if self.accept_symbol("."):
                second = self.name(f"an attribute after {first}.")
                return ast.AttributeRef(first, second, position=position)
            return ast.ColumnRef(first, position=position)
        raise self.error(f"expected an expression, found {token.describe()}")

    def select(self, start: Token) -> ast.Select:
        self.expect_keyword("SELECT", "in the subquery")
        column = None if self.accept_symbol("*") else self.name("the column to SELECT")
        self.expect_keyword("FROM", "in the subquery (SELECT column FROM table …)")
        table_token = self.current
        table = self.name("the table after FROM")
        conditions = self.keys(f"the subquery on {table}", table) if self.accept_keyword("WHERE") else ()
        return ast.Select(table, column, conditions, position=self.position(table_token))


def _unqualify(condition: ast.Expr, table: str) -> ast.Expr:
    """``table.column`` inside a subquery on ``table`` is the column (not an event attribute)."""
    if not isinstance(condition, ast.Compare):
        return condition

    def fix(side: ast.Expr) -> ast.Expr:
        if isinstance(side, ast.AttributeRef) and side.alias.lower() == table.lower():
            return ast.ColumnRef(side.attribute, table, position=side.position)
        return side

    return ast.Compare(condition.operator, fix(condition.left), fix(condition.right), position=condition.position)


def parse(text: str) -> list[ast.QueryDefinition | ast.RuleDefinition]:
    """Parse a script of ``CREATE QUERY`` / ``CREATE RULE`` definitions."""
    if not isinstance(text, str):
        raise DefinitionError(f"define() and parse() take the definitions' text (CREATE QUERY … / CREATE RULE …), got "
                              f"{type(text).__name__} {reprlib.repr(text)}; a definition built in Python goes to "
                              f"engine.query() or engine.rule()")
    return Parser(text).script()


def _column_equality(parser: Parser, condition: ast.Expr, token: Token, what: str) -> tuple[str, ast.Expr]:
    if isinstance(condition, ast.Compare) and condition.operator == "=":
        left, right = condition.left, condition.right
        if isinstance(left, ast.ColumnRef) and not isinstance(right, ast.ColumnRef):
            return left.column, right
        if isinstance(right, ast.ColumnRef) and not isinstance(left, ast.ColumnRef):
            return right.column, left
    raise parser.error(f"the WHERE of {what} takes equalities column = expression joined by AND", token)
