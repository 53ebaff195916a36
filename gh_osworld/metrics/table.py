"""Spreadsheets and CSV files: compare_table (a list of rules, each comparing one aspect of the agent's
workbook with the expected one or with a reference value) and compare_csv.

compare_table's sheets are named as OSWorld's rules name them: an int or "RI<n>" is the result's n-th sheet,
"RN<name>" the result's sheet of that name, "EI<n>"/"EN<name>" the expected workbook's. Values are the ones
stored in the file: what LibreOffice computed and saved for a formula (a workbook written by openpyxl has
no computed values, so its formula cells read as empty). sheet_print compares the sheet as LibreOffice
prints it: the CSV the task's postconfig exports beside the workbook (`<stem>-<sheet>.csv`).

Whose fault: the agent's workbook missing, unreadable or lacking a sheet a rule names is a failure; the
expected workbook (embedded at import) unreadable, or a rule this module does not know, is a crash.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from typing import Any

import openpyxl
import pandas as pd
from lxml import etree
from openpyxl.utils import get_column_letter
from openpyxl.worksheet.cell_range import MultiCellRange

from gh_osworld.matching import matches_rule
from gh_osworld.metrics import cellformula
from gh_osworld.metrics.similarity import ratio
from gh_osworld.outcome import Fail
from gh_osworld.reading import agent_text, ours_text
from gh_osworld.registry import metric

_MAIN = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_REL = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_PKG_REL = "http://schemas.openxmlformats.org/package/2006/relationships"
_X14 = "http://schemas.microsoft.com/office/spreadsheetml/2009/9/main"
_XM = "http://schemas.microsoft.com/office/excel/2006/main"


class _Book:
    """One side's workbook, opened the ways the rules read it (openpyxl, pandas, the raw XML)."""

    def __init__(self, given: str | list[str], ours: bool) -> None:
        paths = [given] if isinstance(given, str) else list(given)
        self.path = paths[0]
        self.companions = paths[1:]  # a multi getter's other files (the exported CSVs)
        self.ours = ours
        self.xl = openpyxl.load_workbook(self.path)
        self.pd = pd.ExcelFile(self.path, engine="openpyxl")
        self.names: list[str] = list(self.xl.sheetnames)
        self._values: dict[str, dict[str, Any]] = {}

    def missing(self, what: str) -> Exception:
        """A sheet or file a rule names that this book lacks: the agent's failure, or our case's error."""
        side = "the expected workbook" if self.ours else "the result"
        msg = f"{side} {os.path.basename(self.path)} has no {what}"
        return LookupError(msg) if self.ours else Fail(msg)

    def sheet(self, name: str) -> Any:
        if name not in self.names:
            raise self.missing(f"sheet {name!r}")
        return self.xl[name]

    def frame(self, name: str) -> pd.DataFrame:
        if name not in self.names:
            raise self.missing(f"sheet {name!r}")
        return pd.read_excel(self.pd, name)

    def printed(self, name: str) -> list[str]:
        """The sheet's exported CSV, lines stripped, trailing empty lines dropped. A CSV that is not UTF-8 is
        read as Latin-1, as desktop-env 1.0.2's sheet_print reads it (its next encodings after UTF-8 and
        UTF-8 with a BOM; Latin-1 reads any bytes)."""
        want = f"{os.path.splitext(os.path.basename(self.path))[0]}-{name}.csv"
        found = [p for p in self.companions if os.path.basename(p) == want or p.endswith(f"-{name}.csv")]
        path = found[0] if found else os.path.join(os.path.dirname(self.path), want)
        try:
            with open(path, "rb") as f:
                data = f.read()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = data.decode("latin-1")
            lines = [line.strip() for line in text.splitlines()]
        except OSError as e:
            if self.ours:
                raise
            raise Fail(f"the sheet {name!r} as printed ({path}): {e}") from e
        while lines and not lines[-1]:
            lines.pop()
        return lines

    def value(self, name: str, coordinate: str) -> Any:
        if name not in self._values:
            if name not in self.names:
                raise self.missing(f"sheet {name!r}")
            self._values[name] = stored_values(self.path, name)
        return self._values[name].get(coordinate.replace("$", "").upper())


def stored_values(path: str, sheet: str) -> dict[str, Any]:
    """The values the file stores for a sheet's cells, as Excel's XML has them: a number is a float, a text
    (shared, inline or a formula's) a str; a boolean, an error or an empty cell has none."""
    with zipfile.ZipFile(path) as z:
        workbook = etree.fromstring(z.read("xl/workbook.xml"))
        rels = etree.fromstring(z.read("xl/_rels/workbook.xml.rels"))
        targets = {r.get("Id"): r.get("Target") for r in rels.iter(f"{{{_PKG_REL}}}Relationship")}
        rid = next(s.get(f"{{{_REL}}}id") for s in workbook.iter(f"{{{_MAIN}}}sheet") if s.get("name") == sheet)
        target = str(targets[rid])
        part = target.lstrip("/") if target.startswith("/") else "xl/" + target
        shared: list[str] = []
        if "xl/sharedStrings.xml" in z.namelist():
            sst = etree.fromstring(z.read("xl/sharedStrings.xml"))
            shared = ["".join(t.text or "" for t in si.iter(f"{{{_MAIN}}}t")) for si in sst.iter(f"{{{_MAIN}}}si")]
        root = etree.fromstring(z.read(part))
    values: dict[str, Any] = {}
    for c in root.iter(f"{{{_MAIN}}}c"):
        kind = c.get("t", "n")
        v = c.find(f"{{{_MAIN}}}v")
        try:
            if kind == "n" and v is not None:
                values[c.get("r")] = float(v.text or "")
            elif kind == "s" and v is not None:
                values[c.get("r")] = shared[int(v.text or "")]
            elif kind == "str" and v is not None:
                values[c.get("r")] = v.text or ""
            elif kind == "inlineStr":
                values[c.get("r")] = "".join(t.text or "" for t in c.iter(f"{{{_MAIN}}}t"))
        except (ValueError, IndexError):
            continue
    return values


# -- cell styles (check_cell's props, the style rule) --

def cell_style(name: str, cell: Any, dxf: Any = None) -> Any:
    """A cell's style property by OSWorld's name; the font's and the number format only for a cell with a
    value (number_format: a number's). With `dxf` (the differential style of a conditional format that
    applies to the cell), the property as that style gives it: None where it sets none."""
    has_value = cell.value is not None
    if name == "number_format":
        if not (has_value and cell.data_type == "n"):
            return None
        if dxf is None:
            return cell.number_format
        return dxf.numFmt.formatCode if dxf.numFmt is not None else None
    fonts: dict[str, Callable[[Any], Any]] = {
        "font_name": lambda f: f.name, "font_family": lambda f: f.family,
        "font_color": lambda f: f.color.rgb if f.color is not None else None,
        "font_bold": lambda f: f.b, "font_italic": lambda f: f.i, "font_underline": lambda f: f.u,
        "font_size": lambda f: f.sz,
    }
    if name in fonts:
        font = cell.font if dxf is None else dxf.font
        return fonts[name](font) if has_value and font is not None else None
    fill = cell.fill if dxf is None else dxf.fill
    if name == "fill_type":
        return getattr(fill, "tagname", None)
    if name in ("bgcolor", "fgcolor"):
        color = getattr(fill, "bgColor" if name == "bgcolor" else "fgColor", None)
        return getattr(color, "rgb", None)
    if name == "hyperlink":
        return (cell.hyperlink or "") if has_value else None
    raise ValueError(f"unknown cell style {name!r}")


# -- what a rule reads from a sheet --

def _conditional_met(rule: Any, values: Callable[[str], Any], coord: str, shift: tuple[int, int]) -> bool:
    if rule.type == "expression":
        return cellformula.holds(rule.formula[0], values, shift)
    if rule.type == "cellIs" and rule.operator in cellformula.CELL_IS:
        try:
            bounds = [cellformula.evaluate(f, values, shift) for f in rule.formula]
            return cellformula.CELL_IS[rule.operator](values(coord), bounds)
        except ValueError:  # a bound that errs: the condition is not met
            return False
    # Which cells a top-10, duplicate, colour-scale... format styles is not worked out here: no verdict is
    # better than one that ignores it.
    raise NotImplementedError(f"conditional formats of type {rule.type} are not evaluated here")


def _sheet_styles(book: _Book, name: str, ws: Any, props: list[str]) -> dict[str, list[Any]]:
    """Each cell's style props; where a conditional format applies to the cell (its expression or cellIs
    condition met over the stored values), the props as its differential style gives them, later formats
    over earlier ones."""
    styles = {c.coordinate: [cell_style(p, c) for p in props] for col in ws.iter_cols() for c in col}

    def values(coord: str) -> Any:
        return book.value(name, coord)
    for cf in ws.conditional_formatting:
        ranges = list(cf.sqref.ranges)
        top, left = ranges[0].min_row, ranges[0].min_col
        for rule in cf.rules:
            for rng in ranges:
                for row, col in rng.cells:
                    coord = f"{get_column_letter(col)}{row}"
                    if _conditional_met(rule, values, coord, (row - top, col - left)):
                        cell = ws.cell(row=row, column=col)
                        styles[coord] = [cell_style(p, cell, rule.dxf) for p in props]
    return styles


def _title(title: Any) -> Any:
    try:
        return title.tx.rich.p[0].r[0].t
    except (AttributeError, IndexError, TypeError):
        return None


def _ref(data: Any) -> str:
    for kind in ("numRef", "strRef"):
        ref = getattr(data, kind, None)
        if ref is not None and getattr(ref, "f", None):
            return str(ref.f)
    return ""


def _charts(ws: Any, props: list[str]) -> dict[str, dict[str, Any]]:
    """The sheet's charts keyed by their series' data and category references, each with the props asked."""
    out: dict[str, dict[str, Any]] = {}
    for ch in ws._charts:
        key = ";".join(f"{_ref(s.val)},{_ref(s.cat)}" for s in ch.series)
        info: dict[str, Any] = {}
        for p in props:
            if p == "title":
                info[p] = _title(ch.title)
            elif p == "legend":
                info[p] = ch.legend.position if ch.legend is not None else None
            elif p == "anchor":
                a = ch.anchor
                to = getattr(a, "to", None)
                info[p] = [getattr(a, "editAs", None), a._from.col, a._from.row, getattr(to, "col", None),
                           getattr(to, "row", None)]
            elif p in ("width", "height"):
                info[p] = getattr(ch, p)
            elif p == "type":
                info[p] = ch.tagname
            elif p == "direction":
                info[p] = getattr(ch, "barDir", None)
            elif p in ("xtitle", "ytitle", "ztitle"):
                axis = getattr(ch, f"{p[0]}_axis", None)
                info[p] = _title(getattr(axis, "title", None))
            else:
                raise ValueError(f"unknown chart property {p!r}")
        out[key] = info
    return out


def _pivots(ws: Any, props: list[str]) -> dict[str, dict[str, Any]]:
    """The sheet's pivot tables keyed by their source range (trimmed to the fields in use), with the props
    asked: name, show_total, show_empty_row/col, show_headers, location, filter, selection (ordered),
    col_fields, row_fields, data_fields (data_fields_name)."""
    want = set(props)
    out: dict[str, dict[str, Any]] = {}
    for pvt in ws._pivots:
        picked = [[(item.h, item.x) for item in f.items if item.x is not None] for f in pvt.pivotFields]
        left = next((i for i, s in enumerate(picked) if s), len(picked))
        right = next((i for i, s in enumerate(reversed(picked)) if s), 0) if left < len(picked) else 0
        selection = picked[left:len(picked) - right]
        src = pvt.cache.cacheSource
        ws_src = src.worksheetSource
        first, _, last = str(ws_src.ref).partition(":")
        (r1, c1), (r2, c2) = (openpyxl.utils.cell.coordinate_to_tuple(x) for x in (first, last or first))
        key = f"{src.type};{(r1, c1 + left)}:{(r2, c2 - right)};{ws_src.sheet}"
        info: dict[str, Any] = {}
        if "name" in want:
            info["name"] = pvt.name
        for prop, attr in (("show_total", "visualTotals"), ("show_empty_row", "showEmptyRow"),
                           ("show_empty_col", "showEmptyCol"), ("show_headers", "showHeaders")):
            if prop in want:
                info[prop] = getattr(pvt, attr)
        if "location" in want:
            loc = pvt.location
            info["location"] = (loc.ref, loc.firstHeaderRow, loc.firstDataRow, loc.firstDataCol)
        if want & {"filter", "selection"}:
            info["selection"] = selection if "ordered" in want else [set(s) for s in selection]
        if "filter" in want:
            info["filter_fields"] = {f.fld for f in pvt.pageFields}
        if "col_fields" in want:
            info["col_fields"] = [f.x - left for f in pvt.colFields]
        if "row_fields" in want:
            info["row_fields"] = [f.x - left for f in pvt.rowFields]
        if "data_fields" in want:
            named = "data_fields_name" in want
            info["data_fields"] = [f"{f.fld - left};{f.name if named else ''};{f.subtotal};{f.showDataAs}"
                                   for f in pvt.dataFields]
        out[key] = info
    return out


def _dimensions(ws: Any, which: str, props: list[str]) -> dict[Any, dict[str, Any]]:
    dims = ws.row_dimensions if which == "row" else ws.column_dimensions
    return {k: {p: getattr(d, p) for p in props} for k, d in dims.items()}


def _filters(ws: Any) -> dict[str, Any]:
    af = ws.auto_filter
    columns = []
    for fc in af.filterColumn:
        col: dict[str, Any] = {"col_id": fc.colId, "hidden_button": fc.hiddenButton, "show_button": fc.showButton}
        if fc.filters is not None:
            col["filters_blank"] = fc.filters.blank
            col["filters"] = set(fc.filters.filter)
        if fc.customFilters is not None:
            col["custom_filters_op"] = fc.customFilters._and
            col["custom_filters"] = {(f.operator, f.val) for f in fc.customFilters.customFilter}
        columns.append(col)
    out: dict[str, Any] = {"ref": af.ref, "filter_column": sorted(columns, key=lambda c: c["col_id"])}
    ss = af.sortState
    if ss is not None:
        out["sort_state"] = {
            "sort": ss.columnSort, "case": ss.caseSensitive, "method": ss.sortMethod, "ref": ss.ref,
            "condition": [{"descending": c.descending, "key": c.sortBy, "ref": c.ref, "custom_list": c.customList,
                           "dxf_id": c.dxfId, "icon": c.iconSet, "iconid": c.iconId} for c in ss.sortCondition]}
    return out


def _sparklines(book: _Book, sheet: str) -> dict[str, str]:
    with zipfile.ZipFile(book.path) as z:
        workbook = etree.fromstring(z.read("xl/workbook.xml"))
        rels = etree.fromstring(z.read("xl/_rels/workbook.xml.rels"))
        targets = {r.get("Id"): r.get("Target") for r in rels.iter(f"{{{_PKG_REL}}}Relationship")}
        rid = next(s.get(f"{{{_REL}}}id") for s in workbook.iter(f"{{{_MAIN}}}sheet") if s.get("name") == sheet)
        target = str(targets[rid])
        root = etree.fromstring(z.read(target.lstrip("/") if target.startswith("/") else "xl/" + target))
    out = {}
    for sp in root.iter(f"{{{_X14}}}sparkline"):
        out[sp.findtext(f"{{{_XM}}}sqref") or ""] = sp.findtext(f"{{{_XM}}}f") or ""
    return out


# -- compare_table --

# The rule types compare_table implements in full; names.TABLE_RULES repeats this for the importer (the
# host cannot import this module) and tests/osworld_guest/test_table.py checks the two agree.
RULES = frozenset({"sheet_name", "sheet_data", "sheet_print", "sheet_fuzzy", "sparkline", "chart", "freeze", "zoom",
                   "data_validation", "row_props", "col_props", "filter", "pivot_table", "check_cell", "style"})


class _Table:
    def __init__(self, result: _Book, expected: _Book | None) -> None:
        self.result, self.expected = result, expected

    def sheet(self, idx: int | str) -> tuple[_Book, str]:
        """The book and sheet name an index names (a name not in the book stays: the rule reports it)."""
        if isinstance(idx, int):
            book, key = self.result, idx
        elif idx[:2] in ("RI", "EI", "RN", "EN"):
            book = self.result if idx[0] == "R" else self.expected  # type: ignore[assignment]
            if book is None:
                raise ValueError(f"sheet {idx!r} names the expected workbook, and there is none")
            if idx[1] == "N":
                return book, idx[2:]
            key = int(idx[2:])
        else:
            raise ValueError(f"unknown sheet index {idx!r}")
        if not 0 <= key < len(book.names):
            raise book.missing(f"sheet number {key}")
        return book, book.names[key]

    def pair(self, r: dict[str, Any]) -> tuple[tuple[_Book, str], tuple[_Book, str]]:
        return self.sheet(r["sheet_idx0"]), self.sheet(r["sheet_idx1"])

    def check(self, r: dict[str, Any]) -> bool:
        kind = r["type"]
        if kind == "sheet_name":
            if self.expected is None:
                raise ValueError("sheet_name needs an expected workbook")
            return self.result.names == self.expected.names
        if kind == "sheet_data":
            (b0, s0), (b1, s1) = self.pair(r)
            digits = r.get("precision", 4)
            # ignore_case, given by one task, is not an option of this rule in OSWorld either.
            return bool(b0.frame(s0).round(digits).equals(b1.frame(s1).round(digits)))
        if kind == "sheet_print":
            (b0, s0), (b1, s1) = self.pair(r)
            p0, p1 = b0.printed(s0), b1.printed(s1)
            if r.get("ignore_case", False):
                p0, p1 = [x.lower() for x in p0], [x.lower() for x in p1]
            return p0 == p1
        if kind == "sheet_fuzzy":
            return self._fuzzy(r)
        if kind == "sparkline":
            (b0, s0), (b1, s1) = self.pair(r)
            b0.sheet(s0), b1.sheet(s1)
            return _sparklines(b0, s0) == _sparklines(b1, s1)
        if kind == "style":
            (b0, s0), (b1, s1) = self.pair(r)
            props = r.get("props", [])
            return _sheet_styles(b0, s0, b0.sheet(s0), props) == _sheet_styles(b1, s1, b1.sheet(s1), props)
        if kind in ("chart", "pivot_table", "row_props", "col_props", "filter", "freeze"):
            (b0, s0), (b1, s1) = self.pair(r)
            w0, w1 = b0.sheet(s0), b1.sheet(s1)
            read: Callable[[Any], Any] = {
                "chart": lambda ws: _charts(ws, r.get("chart_props", [])),
                "pivot_table": lambda ws: _pivots(ws, r.get("pivot_props", [])),
                "row_props": lambda ws: _dimensions(ws, "row", r.get("props", [])),
                "col_props": lambda ws: _dimensions(ws, "column", r.get("props", [])),
                "filter": _filters,
                "freeze": lambda ws: ws.freeze_panes,
            }[kind]
            return bool(read(w0) == read(w1))
        if kind == "zoom":
            book, name = self.sheet(r["sheet_idx"])
            return matches_rule(book.sheet(name).sheet_view.zoomScale or 100, r)
        if kind == "data_validation":
            book, name = self.sheet(r["sheet_idx"])
            found = book.sheet(name).data_validations.dataValidation
            wanted: list[dict[str, Any]] = r["dv_props"]
            if len(found) < len(wanted):
                return False
            # Every validation in the sheet is one of those asked for (and there are at least as many).
            return all(any(all(matches_rule(getattr(dv, attr), m) for attr, m in props.items()) for props in wanted)
                       for dv in found)
        if kind == "check_cell":
            book, name = self.sheet(r["sheet_idx"])
            cell = book.sheet(name)[r["coordinate"]]
            for prop, m in r["props"].items():
                have = book.value(name, r["coordinate"]) if prop == "value" else cell_style(prop, cell)
                if not matches_rule(have, m):
                    return False
            return True
        raise ValueError(f"compare_table: unknown rule type {kind!r}")

    def _fuzzy(self, r: dict[str, Any]) -> bool:
        (b0, s0), (b1, s1) = self.pair(r)
        for rl in r["rules"]:
            for rng in MultiCellRange(rl["range"]):
                for row, col in rng.cells:
                    coord = f"{get_column_letter(col)}{row}"
                    v0, v1 = str(b0.value(s0, coord)), str(b1.value(s1, coord))
                    for old, new in rl.get("normalization", []):
                        v0, v1 = v0.replace(old, new), v1.replace(old, new)
                    if "trim_leadings" in rl:
                        v0, v1 = v0.lstrip(rl["trim_leadings"]), v1.lstrip(rl["trim_leadings"])
                    if "trim_trailings" in rl:
                        v0, v1 = v0.rstrip(rl["trim_trailings"]), v1.rstrip(rl["trim_trailings"])
                    if "ignore_chars" in rl:
                        drop = set(rl["ignore_chars"])
                        v0, v1 = "".join(c for c in v0 if c not in drop), "".join(c for c in v1 if c not in drop)
                    if rl.get("ignore_case", False):
                        v0, v1 = v0.lower(), v1.lower()
                    how = rl["type"]
                    if how == "includes":
                        ok = v1 in v0
                    elif how == "included_by":
                        ok = v0 in v1
                    elif how == "fuzzy_match":
                        ok = ratio(v0, v1) >= rl.get("threshold", 85.0)
                    elif how == "exact_match":
                        ok = v0 == v1
                    else:
                        raise ValueError(f"sheet_fuzzy: unknown match type {how!r}")
                    if not ok:
                        return False
        return True


def _agents_book(result: Any) -> _Book:
    if not result or (isinstance(result, list) and not result[0]):
        raise Fail("no result workbook")
    try:
        return _Book(result, ours=False)
    except Exception as e:  # whatever the agent left that openpyxl or pandas cannot read
        raise Fail(f"the result workbook is unreadable: {type(e).__name__}: {e}"[:500]) from e


@metric("compare_table")
def compare_table(result: Any, expected: Any = None, rules: list[dict[str, Any]] | None = None,
                  **_: Any) -> bool:
    """Every rule holds, in order (the first that does not fails the comparison)."""
    book = _agents_book(result)
    table = _Table(book, _Book(expected, ours=True) if expected else None)
    for r in rules or []:
        if not table.check(r):
            raise Fail(f"rule {r['type']} does not hold")
    return True


# -- CSV --

@metric("compare_csv")
def compare_csv(result: Any, expected: str, strict: bool = True, ignore_case: bool = False, **_: Any) -> bool:
    """Line by line (any newline convention); not strict: each line stripped; ignore_case: lowered."""
    def lines(text: str) -> list[str]:
        out = text.splitlines()
        out = out if strict else [x.strip() for x in out]
        return [x.lower() for x in out] if ignore_case else out
    want = lines(ours_text(expected))
    return lines(agent_text(result)) == want
