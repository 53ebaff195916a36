"""The spreadsheet formulas a conditional format carries, evaluated over a sheet's stored values: enough of
Excel's formula language for the conditions people write (comparisons, arithmetic, text joins, and the
functions in FUNCTIONS). A formula using anything else raises NotImplementedError: no verdict rather than a
wrong one.

References are relative to the format's anchor (the top-left cell of its first range), as Excel stores
them: evaluated for another cell of the range, a relative reference moves with it, `$` parts stay.
"""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Callable
from typing import Any

from openpyxl.utils import column_index_from_string, get_column_letter

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<str>"(?:[^"]|"")*")
    | (?P<ref>\$?[A-Za-z]{1,3}\$?\d+(?::\$?[A-Za-z]{1,3}\$?\d+)?)(?![A-Za-z0-9_(])
    | (?P<func>[A-Za-z][A-Za-z0-9._]*)\s*\(
    | (?P<bool>TRUE|FALSE)(?![A-Za-z0-9_(])
    | (?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)
    | (?P<op><=|>=|<>|[-+*/^&=<>%(),;])
    )""", re.X | re.I)

Values = Callable[[str], Any]  # "A1" -> the stored value (float, str, None)


class _Range(list[Any]):
    """A range's values, flattened (functions take them as many arguments)."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos, text = [], 0, text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise NotImplementedError(f"formula {text!r}: cannot read it at {text[pos:pos + 20]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _num(v: Any) -> float:
    if v is None or v == "":
        return 0.0
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(v)
    except ValueError:
        raise ValueError(f"#VALUE! ({v!r} is no number)") from None


def _flat(args: list[Any]) -> list[Any]:
    out: list[Any] = []
    for a in args:
        out.extend(a if isinstance(a, _Range) else [a])
    return out


def _numbers(args: list[Any]) -> list[float]:
    """A function's numeric arguments: numbers in ranges (text and blanks skipped), direct ones converted."""
    out: list[float] = []
    for a in args:
        if isinstance(a, _Range):
            out.extend(float(v) for v in a if isinstance(v, (int, float)) and not isinstance(v, bool))
        else:
            out.append(_num(a))
    return out


def _weekday(serial: Any, kind: Any = 1) -> float:
    day = datetime.date(1899, 12, 30) + datetime.timedelta(days=int(_num(serial)))
    iso = day.isoweekday()  # Monday 1 .. Sunday 7
    k = int(_num(kind))
    if k == 1:
        return float(iso % 7 + 1)  # Sunday 1 .. Saturday 7
    if k == 2:
        return float(iso)
    if k == 3:
        return float(iso - 1)
    raise NotImplementedError(f"WEEKDAY type {k}")


def _date_part(part: str) -> Callable[[Any], float]:
    def f(serial: Any) -> float:
        day = datetime.date(1899, 12, 30) + datetime.timedelta(days=int(_num(serial)))
        return float(getattr(day, part))
    return f


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "SUM": lambda *a: sum(_numbers(list(a))),
    "MAX": lambda *a: max(_numbers(list(a)), default=0.0),
    "MIN": lambda *a: min(_numbers(list(a)), default=0.0),
    "AVERAGE": lambda *a: (lambda n: sum(n) / len(n))(_numbers(list(a))),
    "COUNT": lambda *a: float(len(_numbers(list(a)))),
    "COUNTA": lambda *a: float(sum(1 for v in _flat(list(a)) if v not in (None, ""))),
    "ABS": lambda x: abs(_num(x)),
    "INT": lambda x: float(math.floor(_num(x))),
    "MOD": lambda x, y: _num(x) % _num(y),
    "ROUND": lambda x, d=0: float(round(_num(x), int(_num(d)))),
    "AND": lambda *a: all(_truth(v) for v in _flat(list(a))),
    "OR": lambda *a: any(_truth(v) for v in _flat(list(a))),
    "NOT": lambda x: not _truth(x),
    "IF": lambda c, a=True, b=False: a if _truth(c) else b,
    "ISBLANK": lambda x: x is None,
    "ISNUMBER": lambda x: isinstance(x, float) and not isinstance(x, bool),
    "LEN": lambda x: float(len(_text(x))),
    "UPPER": lambda x: _text(x).upper(),
    "LOWER": lambda x: _text(x).lower(),
    "TRIM": lambda x: " ".join(_text(x).split()),
    "WEEKDAY": _weekday,
    "DAY": _date_part("day"), "MONTH": _date_part("month"), "YEAR": _date_part("year"),
}


def _truth(v: Any) -> bool:
    if isinstance(v, str):
        if v.upper() in ("TRUE", "FALSE"):
            return v.upper() == "TRUE"
        raise ValueError(f"#VALUE! ({v!r} is no truth value)")
    return bool(_num(v))


def _text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)
    return str(v)


def _rank(v: Any) -> int:
    return 2 if isinstance(v, bool) else 1 if isinstance(v, str) else 0


def _compare(op: str, a: Any, b: Any) -> bool:
    """Excel's comparison: an empty cell is 0 beside a number and "" beside a text; numbers sort before
    texts before truth values; texts compare without case."""
    if a is None:
        a = "" if isinstance(b, str) else False if isinstance(b, bool) else 0.0
    if b is None:
        b = "" if isinstance(a, str) else False if isinstance(a, bool) else 0.0
    if _rank(a) != _rank(b):
        ka, kb = _rank(a), _rank(b)
    elif isinstance(a, str):
        ka, kb = a.lower(), b.lower()  # type: ignore[assignment]
    else:
        ka, kb = a, b
    return {"=": ka == kb, "<>": ka != kb, "<": ka < kb, ">": ka > kb, "<=": ka <= kb, ">=": ka >= kb}[op]


class _Parser:
    def __init__(self, text: str, values: Values, shift: tuple[int, int]) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.values = values
        self.shift = shift  # rows, columns from the anchor to the cell evaluated

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise NotImplementedError(f"formula: expected {value!r}, found {tok!r}")
        self.i += 1
        return tok

    def parse(self) -> Any:
        v = self.comparison()
        if self.peek() is not None:
            raise NotImplementedError(f"formula: unexpected {self.peek()!r}")
        return v

    def comparison(self) -> Any:
        v = self.concat()
        while (t := self.peek()) and t[1] in ("=", "<>", "<", ">", "<=", ">="):
            self.take()
            v = _compare(t[1], v, self.concat())
        return v

    def concat(self) -> Any:
        v = self.additive()
        while (t := self.peek()) and t[1] == "&":
            self.take()
            v = _text(v) + _text(self.additive())
        return v

    def additive(self) -> Any:
        v = self.term()
        while (t := self.peek()) and t[1] in ("+", "-"):
            self.take()
            w = self.term()
            v = _num(v) + _num(w) if t[1] == "+" else _num(v) - _num(w)
        return v

    def term(self) -> Any:
        v = self.power()
        while (t := self.peek()) and t[1] in ("*", "/"):
            self.take()
            w = _num(self.power())
            if t[1] == "/" and w == 0:
                raise ValueError("#DIV/0!")
            v = _num(v) * w if t[1] == "*" else _num(v) / w
        return v

    def power(self) -> Any:
        v = self.unary()
        while (t := self.peek()) and t[1] == "^":
            self.take()
            v = _num(v) ** _num(self.unary())
        return v

    def unary(self) -> Any:
        t = self.peek()
        if t and t[1] in ("-", "+"):
            self.take()
            v = _num(self.unary())
            return -v if t[1] == "-" else v
        v = self.primary()
        while (t := self.peek()) and t[1] == "%":
            self.take()
            v = _num(v) / 100
        return v

    def primary(self) -> Any:
        kind, text = self.take()
        if kind == "num":
            return float(text)
        if kind == "str":
            return text[1:-1].replace('""', '"')
        if kind == "bool":
            return text.upper() == "TRUE"
        if kind == "ref":
            return self.ref(text)
        if kind == "func":
            name = text.upper()
            if name not in FUNCTIONS:
                raise NotImplementedError(f"formula function {name} is not evaluated here")
            args = []
            if self.peek() and self.peek()[1] != ")":  # type: ignore[index]
                args.append(self.comparison())
                while self.peek() and self.peek()[1] in (",", ";"):  # type: ignore[index]
                    self.take()
                    args.append(self.comparison())
            self.take(")")
            return FUNCTIONS[name](*args)
        if text == "(":
            v = self.comparison()
            self.take(")")
            return v
        raise NotImplementedError(f"formula: unexpected {text!r}")

    def _cell(self, ref: str) -> tuple[int, int]:
        m = re.fullmatch(r"(\$?)([A-Za-z]{1,3})(\$?)(\d+)", ref)
        assert m is not None
        col, row = column_index_from_string(m.group(2).upper()), int(m.group(4))
        if not m.group(1):
            col += self.shift[1]
        if not m.group(3):
            row += self.shift[0]
        return row, col

    def ref(self, text: str) -> Any:
        first, _, last = text.partition(":")
        r1, c1 = self._cell(first)
        if not last:
            return self.values(f"{get_column_letter(c1)}{r1}")
        r2, c2 = self._cell(last)
        return _Range(self.values(f"{get_column_letter(c)}{r}")
                      for r in range(min(r1, r2), max(r1, r2) + 1) for c in range(min(c1, c2), max(c1, c2) + 1))


def evaluate(formula: str, values: Values, shift: tuple[int, int] = (0, 0)) -> Any:
    """The formula's value for the cell `shift` (rows, columns) away from its anchor. An Excel error value
    (#VALUE!, #DIV/0!) raises ValueError: a condition that errs is not met."""
    return _Parser(formula.lstrip("="), values, shift).parse()


def holds(formula: str, values: Values, shift: tuple[int, int]) -> bool:
    """Whether a conditional format's expression is met (an error is not)."""
    try:
        v = evaluate(formula, values, shift)
        return _truth(v) if not isinstance(v, _Range) else False
    except (ValueError, ZeroDivisionError, OverflowError):
        return False


CELL_IS: dict[str, Callable[[Any, list[Any]], bool]] = {
    "equal": lambda v, f: _compare("=", v, f[0]),
    "notEqual": lambda v, f: _compare("<>", v, f[0]),
    "greaterThan": lambda v, f: _compare(">", v, f[0]),
    "lessThan": lambda v, f: _compare("<", v, f[0]),
    "greaterThanOrEqual": lambda v, f: _compare(">=", v, f[0]),
    "lessThanOrEqual": lambda v, f: _compare("<=", v, f[0]),
    "between": lambda v, f: _compare(">=", v, min(f, key=_num)) and _compare("<=", v, max(f, key=_num)),
    "notBetween": lambda v, f: not (_compare(">=", v, min(f, key=_num)) and _compare("<=", v, max(f, key=_num))),
}
