"""compare_table (each rule type the tasks use) and compare_csv (gh_osworld/metrics/table.py), run on the guest's
Python against workbooks made with openpyxl there.

openpyxl saves no computed values: a formula cell reads as empty to sheet_data and check_cell's value, where
a workbook LibreOffice saved carries what it computed. So these workbooks hold values, as LibreOffice's
saves do for the cells the rules compare.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest

from gh_osworld import names

from .kit import check, crash, embedded, make, metric, verdict, vm_file

# A workbook: Sheet1 with a header and three rows, then whatever `extra` does to `wb`/`ws`.
BOOK = """
import openpyxl
wb = openpyxl.Workbook()
ws = wb.active
ws.title = "Sheet1"
for row in rows:
    ws.append(row)
{extra}
wb.save(path)
"""
ROWS = [["Name", "Sales"], ["a", 1.5], ["b", 2.25], ["c", 3.0]]


def book(tmp: Path, name: str, extra: str = "", rows: list[list[Any]] | None = None) -> Path:
    path = tmp / name
    make(BOOK.format(extra=extra), tmp, path=str(path), rows=ROWS if rows is None else rows)
    return path


def table(result: Path, expected: Path | None, *rules: dict[str, Any]) -> dict[str, Any]:
    return check(metric("compare_table", vm_file(result), embedded(expected) if expected else None,
                        rules=list(rules)))


DATA = {"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}


def test_the_table_rules_offered_are_the_implemented_ones() -> None:
    src = (Path(__file__).resolve().parents[2] / "gh_osworld/metrics/table.py").read_text()
    # RULES in table.py, which the host cannot import (openpyxl, pandas), and names.TABLE_RULES agree
    body = src.split("RULES = frozenset({", 1)[1].split("})", 1)[0]
    assert {x.strip().strip('"') for x in body.replace("\n", " ").split(",") if x.strip()} == names.TABLE_RULES
    assert {"compare_table", "compare_csv"} <= names.METRICS


def test_sheet_data_values_rounded_and_wrong_values(tmp_path: Path) -> None:
    gold = book(tmp_path, "gold.xlsx")
    assert verdict(table(book(tmp_path, "same.xlsx"), gold, DATA), tmp_path) is True
    near = [ROWS[0], ["a", 1.50001], *ROWS[2:]]  # equal at the default precision of 4 digits
    assert verdict(table(book(tmp_path, "near.xlsx", rows=near), gold, DATA), tmp_path) is True
    far = [ROWS[0], ["a", 1.6], *ROWS[2:]]
    assert verdict(table(book(tmp_path, "far.xlsx", rows=far), gold, DATA), tmp_path) is False
    assert verdict(table(book(tmp_path, "far.xlsx", rows=far), gold, dict(DATA, precision=0)), tmp_path) is True
    text = [ROWS[0], ["a", "1.5"], *ROWS[2:]]  # pandas reads a number typed as text as the number, as OSWorld's
    assert verdict(table(book(tmp_path, "text.xlsx", rows=text), gold, DATA), tmp_path) is True
    case = [ROWS[0], ["A", 1.5], *ROWS[2:]]
    assert verdict(table(book(tmp_path, "case.xlsx", rows=case), gold, DATA), tmp_path) is False
    assert verdict(table(book(tmp_path, "short.xlsx", rows=ROWS[:3]), gold, DATA), tmp_path) is False


def test_sheets_by_name_and_index_and_a_missing_sheet(tmp_path: Path) -> None:
    two = 'ws2 = wb.create_sheet("Sheet2"); ws2["A1"] = "x"'
    gold = book(tmp_path, "gold.xlsx", two)
    by_name = {"type": "sheet_data", "sheet_idx0": "RNSheet2", "sheet_idx1": "ENSheet2"}
    by_index = {"type": "sheet_data", "sheet_idx0": "RI1", "sheet_idx1": "EI1"}
    assert verdict(table(book(tmp_path, "r.xlsx", two), gold, by_name, by_index), tmp_path) is True
    one = book(tmp_path, "one.xlsx")
    assert verdict(table(one, gold, by_name), tmp_path) is False
    assert verdict(table(one, gold, by_index), tmp_path) is False
    names_rule = {"type": "sheet_name"}
    renamed = book(tmp_path, "renamed.xlsx", 'ws2 = wb.create_sheet("Other"); ws2["A1"] = "x"')
    assert verdict(table(book(tmp_path, "r.xlsx", two), gold, names_rule), tmp_path) is True
    assert verdict(table(renamed, gold, names_rule), tmp_path) is False


def test_missing_corrupt_result_fails_broken_expected_crashes(tmp_path: Path) -> None:
    gold = book(tmp_path, "gold.xlsx")
    assert verdict(table(tmp_path / "absent.xlsx", gold, DATA), tmp_path) is False
    (tmp_path / "corrupt.xlsx").write_bytes(b"PK\x03\x04 not a workbook")
    assert verdict(table(tmp_path / "corrupt.xlsx", gold, DATA), tmp_path) is False
    (tmp_path / "broken_gold.xlsx").write_bytes(b"not a workbook")
    assert "the check crashed" in crash(table(book(tmp_path, "r.xlsx"), tmp_path / "broken_gold.xlsx", DATA),
                                        tmp_path)
    # a rule type nobody implements is no verdict either
    assert crash(table(book(tmp_path, "r.xlsx"), gold, {"type": "sheet_magic"}), tmp_path)


def test_sheet_print_compares_the_exported_csv(tmp_path: Path) -> None:
    gold = book(tmp_path, "t_gold.xlsx")
    (tmp_path / "t_gold-Sheet1.csv").write_text("Name,Sales\na,1.50\nb,2.25\n\n\n")
    result = book(tmp_path, "t.xlsx")
    rule = {"type": "sheet_print", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"}
    (tmp_path / "t-Sheet1.csv").write_text("Name,Sales  \r\na,1.50\r\nb,2.25\r\n")
    assert verdict(table(result, gold, rule), tmp_path) is True
    (tmp_path / "t-Sheet1.csv").write_text("Name,Sales\na,1.5\nb,2.25\n")  # printed with other decimals
    assert verdict(table(result, gold, rule), tmp_path) is False
    (tmp_path / "t-Sheet1.csv").write_text("NAME,Sales\na,1.50\nb,2.25\n")
    assert verdict(table(result, gold, rule), tmp_path) is False
    assert verdict(table(result, gold, dict(rule, ignore_case=True)), tmp_path) is True
    (tmp_path / "t-Sheet1.csv").unlink()
    assert verdict(table(result, gold, rule), tmp_path) is False
    # the getter may hand the workbook with its CSV (multi, gives [0, 1])
    (tmp_path / "t-Sheet1.csv").write_text("Name,Sales\na,1.50\nb,2.25\n")
    multi = {"type": "vm_file", "multi": True, "path": [str(result), str(tmp_path / "t-Sheet1.csv")],
             "dest": ["t.xlsx", "t-Sheet1.csv"], "gives": [0, 1]}
    spec = check(metric("compare_table", multi, embedded(gold), rules=[rule]))
    assert verdict(spec, tmp_path) is True


def test_sheet_fuzzy_match_types_and_normalisations(tmp_path: Path) -> None:
    gold = book(tmp_path, "gold.xlsx", rows=[["Name", "Where"], ["Smith, John", "12 Main Road"], ["x", 1]])
    rows = [["name", "Where"], [" Smith, Jon ", "12 Main Rd"], ["xy", 1]]
    result = book(tmp_path, "r.xlsx", rows=rows)

    def fuzzy(*rules: dict[str, Any]) -> dict[str, Any]:
        return table(result, gold, {"type": "sheet_fuzzy", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1",
                                    "rules": list(rules)})
    assert verdict(fuzzy({"range": ["A1:B1"], "type": "exact_match"}), tmp_path) is False
    assert verdict(fuzzy({"range": ["A1:B1"], "type": "exact_match", "ignore_case": True}), tmp_path) is True
    assert verdict(fuzzy({"range": ["B3"], "type": "exact_match"}), tmp_path) is True
    assert verdict(fuzzy({"range": ["A3:B3"], "type": "exact_match"}), tmp_path) is False
    assert verdict(fuzzy({"range": ["B2"], "type": "exact_match", "normalization": [["Road", "Rd"]]}),
                   tmp_path) is True
    trimmed = {"range": ["A2"], "type": "fuzzy_match", "trim_leadings": " ", "trim_trailings": " "}
    assert verdict(fuzzy(dict(trimmed, threshold=90)), tmp_path) is True  # "Smith, Jon" vs "Smith, John": 95.2
    assert verdict(fuzzy(dict(trimmed, threshold=96)), tmp_path) is False
    assert verdict(fuzzy({"range": ["A3"], "type": "includes"}), tmp_path) is True  # the result holds the expected
    assert verdict(fuzzy({"range": ["A3"], "type": "included_by"}), tmp_path) is False
    assert verdict(fuzzy({"range": ["A2"], "type": "exact_match", "ignore_chars": " ,h"}), tmp_path) is True


def test_check_cell_value_and_style(tmp_path: Path) -> None:
    styled = ('from openpyxl.styles import Font, PatternFill\n'
              'ws["D1"] = "Profile"; ws["D1"].font = Font(bold=True, color="FFFFFFFF")\n'
              'ws["D1"].fill = PatternFill("solid", fgColor="FF0000FF", bgColor="FF0000FF")\n'
              'ws["E3"] = 191.66671')
    result = book(tmp_path, "r.xlsx", styled)

    def cell(coord: str, **props: dict[str, Any]) -> dict[str, Any]:
        return table(result, None, {"type": "check_cell", "sheet_idx": 0, "coordinate": coord, "props": props})
    assert verdict(cell("E3", value={"method": "approx:0.001", "ref": 191.6667}), tmp_path) is True
    assert verdict(cell("E3", value={"method": "approx:0.001", "ref": 191.7}), tmp_path) is False
    assert verdict(cell("A1", value={"method": "approx:0.1", "ref": 1}), tmp_path) is False  # text, no number
    right = {"bgcolor": {"method": "eq", "ref": "FF0000FF"}, "font_color": {"method": "eq", "ref": "FFFFFFFF"},
             "font_bold": {"method": "eq", "ref": True}, "value": {"method": "eq", "ref": "Profile"}}
    assert verdict(cell("D1", **right), tmp_path) is True
    assert verdict(cell("D1", **dict(right, font_color={"method": "eq", "ref": "FF000000"})), tmp_path) is False
    assert verdict(cell("A1", **right), tmp_path) is False
    assert verdict(cell("D1", value={"method": "re.I", "ref": "^prof"}), tmp_path) is True


def test_chart_type_title_direction_legend_axes(tmp_path: Path) -> None:
    chart = """
from openpyxl.chart import BarChart, LineChart, Reference
ch = {kind}()
{more}
ch.add_data(Reference(ws, min_col=2, min_row=1, max_row=4), titles_from_data=True)
ch.set_categories(Reference(ws, min_col=1, min_row=2, max_row=4))
ws.add_chart(ch, "E2")
"""
    def with_chart(name: str, kind: str = "BarChart", more: str = "") -> Path:
        return book(tmp_path, name, chart.format(kind=kind, more=more))
    gold = with_chart("gold.xlsx", more='ch.title = "Sales"; ch.type = "col"; ch.x_axis.title = "Name"')
    props = ["type", "title", "direction", "legend", "xtitle", "ytitle"]
    rule = {"type": "chart", "sheet_idx0": 0, "sheet_idx1": "EI0", "chart_props": props}
    right = with_chart("r.xlsx", more='ch.title = "Sales"; ch.type = "col"; ch.x_axis.title = "Name"')
    assert verdict(table(right, gold, rule), tmp_path) is True
    wrong = {
        "line.xlsx": ("LineChart", 'ch.title = "Sales"; ch.x_axis.title = "Name"'),
        "title.xlsx": ("BarChart", 'ch.title = "Revenue"; ch.type = "col"; ch.x_axis.title = "Name"'),
        "horizontal.xlsx": ("BarChart", 'ch.title = "Sales"; ch.type = "bar"; ch.x_axis.title = "Name"'),
        "legend.xlsx": ("BarChart", 'ch.title = "Sales"; ch.type = "col"; ch.x_axis.title = "Name"; ch.legend = None'),
        "axis.xlsx": ("BarChart", 'ch.title = "Sales"; ch.type = "col"'),
    }
    for name, (kind, more) in wrong.items():
        assert verdict(table(with_chart(name, kind, more), gold, rule), tmp_path) is False, name
    assert verdict(table(book(tmp_path, "none.xlsx"), gold, rule), tmp_path) is False
    # other data plotted is another chart
    other = chart.replace("min_col=2, min_row=1, max_row=4", "min_col=2, min_row=1, max_row=3")
    moved = book(tmp_path, "moved.xlsx", other.format(kind="BarChart", more='ch.title = "Sales"; ch.type = "col"; '
                                                                           'ch.x_axis.title = "Name"'))
    assert verdict(table(moved, gold, rule), tmp_path) is False


def test_freeze_zoom_rows_cols(tmp_path: Path) -> None:
    gold = book(tmp_path, "gold.xlsx", 'ws.freeze_panes = "A2"; ws.row_dimensions[3].hidden = True\n'
                                       'ws.column_dimensions["B"].width = 20')
    right = book(tmp_path, "r.xlsx", 'ws.freeze_panes = "A2"; ws.row_dimensions[3].hidden = True\n'
                                     'ws.column_dimensions["B"].width = 20; ws.sheet_view.zoomScale = 80')
    plain = book(tmp_path, "plain.xlsx")
    freeze = {"type": "freeze", "sheet_idx0": 0, "sheet_idx1": "EI0"}
    rows = {"type": "row_props", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": ["hidden"]}
    cols = {"type": "col_props", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": ["width"]}
    zoom = {"type": "zoom", "sheet_idx": 0, "method": "lt", "ref": 100}
    assert verdict(table(right, gold, freeze, rows, cols, zoom), tmp_path) is True
    for rule in (freeze, rows, cols, zoom):  # a sheet without zoom is at 100
        assert verdict(table(plain, gold, rule), tmp_path) is False, rule["type"]
    other_row = book(tmp_path, "row4.xlsx", 'ws.freeze_panes = "A2"; ws.row_dimensions[4].hidden = True')
    assert verdict(table(other_row, gold, rows), tmp_path) is False


def test_data_validation(tmp_path: Path) -> None:
    dv = ('from openpyxl.worksheet.datavalidation import DataValidation\n'
          'dv = DataValidation(type="{type}", formula1={formula!r}); dv.add("{rng}"); ws.add_data_validation(dv)')

    def with_dv(name: str, type: str = "list", formula: str = '"Pass,Fail,Held"', rng: str = "D2:D29") -> Path:
        return book(tmp_path, name, dv.format(type=type, formula=formula, rng=rng))
    rule = {"type": "data_validation", "sheet_idx": 0, "dv_props": [{
        "ranges": {"method": "spreadsheet_range", "ref": ["D2:D29", "D2:D1048576"]},
        "type": {"method": "eq", "ref": "list"},
        "formula1": {"method": "str_set_eq", "ref": ["Pass", "Fail", "Held"]}}]}
    assert verdict(table(with_dv("r.xlsx"), None, rule), tmp_path) is True
    assert verdict(table(with_dv("whole.xlsx", rng="D2:D1048576"), None, rule), tmp_path) is True
    assert verdict(table(with_dv("order.xlsx", formula='"Held,Pass,Fail"'), None, rule), tmp_path) is True
    assert verdict(table(with_dv("short.xlsx", rng="D2:D10"), None, rule), tmp_path) is False
    assert verdict(table(with_dv("wide.xlsx", rng="C2:D29"), None, rule), tmp_path) is False
    assert verdict(table(with_dv("values.xlsx", formula='"Pass,Fail"'), None, rule), tmp_path) is False
    assert verdict(table(with_dv("type.xlsx", type="whole", formula="1"), None, rule), tmp_path) is False
    assert verdict(table(book(tmp_path, "none.xlsx"), None, rule), tmp_path) is False


def test_filter(tmp_path: Path) -> None:
    flt = 'ws.auto_filter.ref = "A1:B4"; ws.auto_filter.add_filter_column(0, {values!r})'
    gold = book(tmp_path, "gold.xlsx", flt.format(values=["a", "b"]))
    rule = {"type": "filter", "sheet_idx0": 0, "sheet_idx1": "EI0"}
    assert verdict(table(book(tmp_path, "r.xlsx", flt.format(values=["b", "a"])), gold, rule), tmp_path) is True
    assert verdict(table(book(tmp_path, "w.xlsx", flt.format(values=["a"])), gold, rule), tmp_path) is False
    assert verdict(table(book(tmp_path, "none.xlsx"), gold, rule), tmp_path) is False


def _add_sparkline(path: Path, sqref: str, source: str) -> None:
    """openpyxl writes no sparklines: put Excel's x14 extension into the sheet's XML."""
    ext = ('<extLst><ext uri="{05C60535-1F16-4fd2-B633-F4F36F0B64E0}" '
           'xmlns:x14="http://schemas.microsoft.com/office/spreadsheetml/2009/9/main">'
           '<x14:sparklineGroups xmlns:xm="http://schemas.microsoft.com/office/excel/2006/main">'
           f'<x14:sparklineGroup><x14:sparklines><x14:sparkline><xm:f>{source}</xm:f><xm:sqref>{sqref}</xm:sqref>'
           '</x14:sparkline></x14:sparklines></x14:sparklineGroup></x14:sparklineGroups></ext></extLst>')
    with zipfile.ZipFile(path) as z:
        parts = {n: z.read(n) for n in z.namelist()}
    sheet = parts["xl/worksheets/sheet1.xml"].decode()
    parts["xl/worksheets/sheet1.xml"] = sheet.replace("</worksheet>", ext + "</worksheet>").encode()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in parts.items():
            z.writestr(n, data)


def test_sparkline(tmp_path: Path) -> None:
    gold = book(tmp_path, "gold.xlsx")
    _add_sparkline(gold, "C2", "Sheet1!A2:B2")
    rule = {"type": "sparkline", "sheet_idx0": 0, "sheet_idx1": "EI0"}
    right = book(tmp_path, "r.xlsx")
    _add_sparkline(right, "C2", "Sheet1!A2:B2")
    assert verdict(table(right, gold, rule), tmp_path) is True
    wrong = book(tmp_path, "w.xlsx")
    _add_sparkline(wrong, "C2", "Sheet1!A3:B3")
    assert verdict(table(wrong, gold, rule), tmp_path) is False
    assert verdict(table(book(tmp_path, "none.xlsx"), gold, rule), tmp_path) is False


def test_style_compares_cells_and_conditional_formats(tmp_path: Path) -> None:
    fill = ('from openpyxl.styles import PatternFill\n'
            'ws["B2"].fill = PatternFill("solid", fgColor="FFFF0000", bgColor="{c}")')
    gold = book(tmp_path, "gold.xlsx", fill.format(c="FFFF0000"))
    rule = {"type": "style", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": ["bgcolor"]}
    assert verdict(table(book(tmp_path, "r.xlsx", fill.format(c="FFFF0000")), gold, rule), tmp_path) is True
    assert verdict(table(book(tmp_path, "w.xlsx", fill.format(c="FF00FF00")), gold, rule), tmp_path) is False
    # the highest sale highlighted: by hand (gold), or by a conditional format met only at B4 (3.0)
    by_hand = book(tmp_path, "hand.xlsx", fill.replace("B2", "B4").format(c="FFFF0000"))
    cond = ('from openpyxl.formatting.rule import FormulaRule, CellIsRule\nfrom openpyxl.styles import PatternFill\n'
            'ws.conditional_formatting.add("B2:B4", {rule})')
    red = 'fill=PatternFill(bgColor="FFFF0000")'
    formats = {
        "max.xlsx": (f'FormulaRule(formula=["B2=MAX($B$2:$B$4)"], {red})', True),
        "gt.xlsx": (f'CellIsRule(operator="greaterThan", formula=["2.5"], {red})', True),
        "between.xlsx": (f'CellIsRule(operator="between", formula=["2", "$B$4"], {red})', False),  # B3 and B4
        "weekday.xlsx": (f'FormulaRule(formula=["AND(WEEKDAY(B2)=1, B2>2)"], {red})', False),  # serial 3: a Tuesday
        "text.xlsx": (f'FormulaRule(formula=["$A2=\\"c\\""], {red})', True),  # the row whose name is c
    }
    for name, (made, ok) in formats.items():
        result = book(tmp_path, name, cond.format(rule=made))
        assert verdict(table(result, by_hand, rule), tmp_path) is ok, name
    other = book(tmp_path, "dup.xlsx", cond.format(rule='Rule(type="duplicateValues", dxf=DifferentialStyle())')
                 .replace("import FormulaRule", "import Rule, FormulaRule")
                 .replace("import PatternFill", "import PatternFill\nfrom openpyxl.styles.differential import "
                                                "DifferentialStyle"))
    assert "duplicateValues are not evaluated" in crash(table(other, by_hand, rule), tmp_path)


PIVOT = """
from openpyxl.pivot.cache import CacheDefinition, CacheSource, WorksheetSource, CacheField, SharedItems
from openpyxl.pivot.table import TableDefinition, Location, PivotField, FieldItem, RowColField, DataField
from openpyxl.pivot.record import RecordList
source = CacheSource(type="worksheet", worksheetSource=WorksheetSource(ref="A1:B4", sheet="Sheet1"))
cache = CacheDefinition(cacheSource=source, cacheFields=[CacheField(name="Name", sharedItems=SharedItems(count=3)),
                                                         CacheField(name="Sales", sharedItems=SharedItems())])
cache.records = RecordList()
where = Location(ref="D1:E5", firstHeaderRow=1, firstDataRow=1, firstDataCol=1)
pt = TableDefinition(name="P1", cacheId=1, dataCaption="Values", location=where)
pt.cache = cache
items = [FieldItem(x=0), FieldItem(x=1), FieldItem(x=2), FieldItem(t="default")]
pt.pivotFields = [PivotField(axis="axisRow", showAll=False, items=items), PivotField(dataField=True, showAll=False)]
pt.rowFields = [RowColField(x={row})]
pt.dataFields = [DataField(name="Sum - Sales", fld=1, subtotal="{subtotal}")]
ws._pivots.append(pt)
"""


def test_pivot_table(tmp_path: Path) -> None:
    gold = book(tmp_path, "gold.xlsx", PIVOT.format(row=0, subtotal="sum"))
    rule = {"type": "pivot_table", "sheet_idx0": 0, "sheet_idx1": "EI0",
            "pivot_props": ["col_fields", "filter", "row_fields", "data_fields"]}
    assert verdict(table(book(tmp_path, "r.xlsx", PIVOT.format(row=0, subtotal="sum")), gold, rule), tmp_path) is True
    assert verdict(table(book(tmp_path, "avg.xlsx", PIVOT.format(row=0, subtotal="average")), gold, rule),
                   tmp_path) is False
    assert verdict(table(book(tmp_path, "rows.xlsx", PIVOT.format(row=1, subtotal="sum")), gold, rule),
                   tmp_path) is False
    assert verdict(table(book(tmp_path, "none.xlsx"), gold, rule), tmp_path) is False


@pytest.mark.parametrize(("text", "options", "ok"), [
    ("a,b\r\n1,2\r\n", {}, True),                       # newlines as any convention
    ("a,b\n1,2", {}, True),
    ("a,b\n1,3\n", {}, False),
    ("a,b \n1,2\n", {}, False),
    ("a,b \n1,2\n", {"strict": False}, True),
    ("A,B\n1,2\n", {}, False),
    ("A,B\n1,2\n", {"ignore_case": True}, True),
    ("a,b\n", {}, False),
])
def test_compare_csv(tmp_path: Path, text: str, options: dict[str, Any], ok: bool) -> None:
    (tmp_path / "gold.csv").write_text("a,b\n1,2\n")
    (tmp_path / "r.csv").write_bytes(text.encode())
    spec = check(metric("compare_csv", vm_file(tmp_path / "r.csv"), embedded(tmp_path / "gold.csv"), **options))
    assert verdict(spec, tmp_path) is ok


def test_compare_csv_missing_or_undecodable_fails(tmp_path: Path) -> None:
    (tmp_path / "gold.csv").write_text("a,b\n")
    (tmp_path / "bad.csv").write_bytes(b"\xff\xfe\x00a")
    for name in ("absent.csv", "bad.csv"):
        spec = check(metric("compare_csv", vm_file(tmp_path / name), embedded(tmp_path / "gold.csv")))
        assert verdict(spec, tmp_path) is False
    spec = check(metric("compare_csv", vm_file(tmp_path / "gold.csv"), embedded(tmp_path / "absent_gold.csv")))
    assert crash(spec, tmp_path)
