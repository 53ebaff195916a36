"""The accessibility tree's XML (gh_osworld/a11y.py) and the checks on it, on the guest's Python. Reading
the live tree with pyatspi needs a desktop session: that runs in the guest (tests/desktop); here the
shaping is built from nodes as the walk reads them, and judged with OSWorld's tasks' own selectors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .kit import check, make, metric, verdict

# A Thunderbird window as AT-SPI shows it: the message header toolbar with its To pills, and a tab list.
TREE = """
from gh_osworld import a11y
from gh_osworld.getters.a11y import focused_terminal_text
N = a11y.Node
root = a11y.desktop()
app = a11y.element(N("application", "Thunderbird"))
root.append(app)
frame = a11y.element(N("frame", "Inbox - Thunderbird", states=["active", "visible", "showing"],
                       extents=(0, 0, 1920, 1080)))
app.append(frame)
bar = a11y.element(N("tool bar", "", attributes={"id": "MsgHeadersToolbar", "xml-roles": "toolbar"}))
frame.append(bar)
bar.append(a11y.element(N("label", "To")))
for who in recipients:
    pill = a11y.element(N("section", "", attributes={"class": "address-pill"}))
    pill.append(a11y.element(N("label", who, text=who, attributes={"class": "pill-label"})))
    bar.append(pill)
tabs = a11y.element(N("page tab list", "", attributes={"id": "tabmail-tabs"}))
frame.append(tabs)
for t in tab_names:
    tabs.append(a11y.element(N("page tab", t, states=["selectable"], actions=[("switch", "Switch", "")])))
term_app = a11y.element(N("application", "xfce4-terminal"))
root.append(term_app)
term_frame = a11y.element(N("frame", "Terminal", states=["active"] if terminal_active else []))
term_app.append(term_frame)
shown = "$ stty size\\n43 132\\n\\x1b$ \\ufffc  "
term_frame.append(a11y.element(N("terminal", "Terminal", states=["focused"], text=shown)))
open(out, "w").write(a11y.to_string(root))
open(out + ".term", "w").write(repr(focused_terminal_text(root)))
"""

TO_SELECTORS = [
    {"selectors": ['tool-bar[attr|id=MsgHeadersToolbar] label[name=To]~[attr|class="address-pill"]>'
                   'label[attr|class="pill-label"][name*="fox@someuniversity.edu"]']},
    {"selectors": ['tool-bar[attr|id=MsgHeadersToolbar] label[name=To]~[attr|class="address-pill"]>'
                   'label[attr|class="pill-label"][name*="iron@someuniversity.edu"]']},
]
TAB_SELECTOR = [{"selectors": ['application[name=Thunderbird] page-tab-list[attr|id="tabmail-tabs"]>'
                               'page-tab[name="About Profiles"]']}]


def tree(tmp: Path, *, recipients: list[str], tabs: list[str], terminal_active: bool = True) -> dict[str, Any]:
    out = tmp / "tree.xml"
    make(TREE, tmp, out=str(out), recipients=recipients, tab_names=tabs, terminal_active=terminal_active)
    return {"type": "vm_command_line", "command": ["cat", str(out)]}


def judge(tmp: Path, xml: dict[str, Any], rules: list[dict[str, Any]]) -> bool:
    expected = {"type": "rule", "rules": rules}
    return verdict(check(metric("check_accessibility_tree", xml, expected)), tmp)


def test_the_tasks_selectors(tmp_path: Path) -> None:
    right = tree(tmp_path, recipients=["fox@someuniversity.edu", "iron@someuniversity.edu"],
                 tabs=["Inbox", "About Profiles"])
    assert judge(tmp_path, right, TO_SELECTORS)
    assert judge(tmp_path, right, TAB_SELECTOR)
    wrong = tree(tmp_path, recipients=["fox@someuniversity.edu"], tabs=["Inbox"])
    assert not judge(tmp_path, wrong, TO_SELECTORS)
    assert not judge(tmp_path, wrong, TAB_SELECTOR)


def test_xpath_states_and_text(tmp_path: Path) -> None:
    xml = tree(tmp_path, recipients=["a@b"], tabs=["Inbox"])
    assert judge(tmp_path, xml, [{"xpath": '//frame[@st:active="true"]//terminal[@st:focused="true"]'}])
    assert judge(tmp_path, xml, [{"xpath": "//page-tab[@act:switch_desc='Switch']"}])
    assert judge(tmp_path, xml, [{"xpath": "//label[@attr:class='pill-label']", "text": "a@b", "exact": True}])
    assert not judge(tmp_path, xml, [{"xpath": "//label[@attr:class='pill-label']", "text": "x", "exact": True}])
    assert not judge(tmp_path, xml, [{"xpath": "//push-button"}])
    # the terminal's text, as vm_terminal_output gives it: right-trimmed, XML-safe, placeholders dropped
    assert (tmp_path / "tree.xml.term").read_text() == repr("$ stty size\n43 132\n$")
    tree(tmp_path, recipients=["a@b"], tabs=["Inbox"], terminal_active=False)
    assert (tmp_path / "tree.xml.term").read_text() == "None"


def test_not_xml_fails(tmp_path: Path) -> None:
    (tmp_path / "junk").write_text("<desktop-frame><unclosed>")
    junk = {"type": "vm_command_line", "command": ["cat", str(tmp_path / "junk")]}
    assert not judge(tmp_path, junk, TAB_SELECTOR)
    assert not judge(tmp_path, {"type": "vm_command_line", "command": ["/none"]}, TAB_SELECTOR)
