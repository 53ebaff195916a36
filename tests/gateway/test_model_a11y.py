"""The accessibility tree as the model's text (gh_server/agents/model/a11y.py): OSWorld's linearized
table. bench/a11y_read.py checks the same rules against OSWorld's own published function."""

from __future__ import annotations

from pathlib import Path

import pytest

from gh_server.agents.model import a11y
from providers.qemu import atspi_tree as T

SHOWN = ["showing", "visible", "enabled"]
DATA = Path(__file__).with_name("data")


def _tree() -> str:
    return T.to_xml([T.Node("application", "mousepad", children=[
        T.Node("frame", "notes.txt - Mousepad", states=SHOWN, extents=(0, 27, 1280, 773), children=[
            T.Node("push button", "Save", states=SHOWN, extents=(40, 60, 32, 32)),
            T.Node("text", "", states=["showing", "visible", "editable"], extents=(0, 100, 1280, 700),
                   text='say "hi"\tthere'),
            T.Node("push button", "Hidden", states=["visible", "enabled"], extents=(1, 1, 5, 5)),  # not showing
            T.Node("push button", "Greyed", states=["showing", "visible"], extents=(1, 1, 5, 5)),  # not usable
            T.Node("push button", "", states=SHOWN, extents=(1, 1, 5, 5)),  # no name, no text
            T.Node("push button", "Off screen", states=SHOWN, extents=(-5, 1, 5, 5)),
            T.Node("push button", "Empty", states=SHOWN, extents=(1, 1, 0, 5)),
            T.Node("panel", "A panel", states=SHOWN, extents=(1, 1, 5, 5)),  # not a kept role
            T.Node("menu item", "Open", states=SHOWN, extents=(5, 30, 60, 20)),
            T.Node("document web", "Page", states=SHOWN, extents=(0, 0, 10, 10)),
        ])])], 1 << 20)


def test_kept_nodes_become_tab_separated_lines_in_document_order() -> None:
    lines = a11y.linearize(_tree()).split("\n")
    assert lines[0] == a11y.HEADER
    assert lines[1:] == [
        "push-button\tSave\t\"\"\t\t\t(40, 60)\t(32, 32)",
        'text\t\t"say ""hi""\tthere"\t\t\t(0, 100)\t(1280, 700)',
        "menu-item\tOpen\t\"\"\t\t\t(5, 30)\t(60, 20)",
        "document-web\tPage\t\"\"\t\t\t(0, 0)\t(10, 10)",
    ]


def test_the_text_is_bounded_and_says_it_was_cut() -> None:
    whole = a11y.linearize(_tree())
    cut = a11y.linearize(_tree(), max_chars=40)
    assert cut == whole[:40] + "[...]\n"
    assert a11y.linearize(_tree(), max_chars=len(whole)) == whole


def test_a_body_that_is_not_xml_is_refused() -> None:
    with pytest.raises(a11y.NotATree):
        a11y.linearize("<desktop-frame>")


@pytest.mark.parametrize("name", ["linux-desktop"])
def test_a_recorded_desktop_tree_linearizes_as_osworlds_own_function_does(name: str) -> None:
    # Read from a real linux-desktop with Mousepad open, with OSWorld's text of it from desktop-env 1.0.2's
    # linearize_accessibility_tree (bench/a11y_read.py --record tests/gateway/data).
    xml = (DATA / f"a11y-{name}.xml").read_text()
    theirs = (DATA / f"a11y-{name}.osworld.txt").read_text()
    ours = a11y.linearize(xml)
    assert ours == theirs
    assert len(ours.splitlines()) > 5  # a desktop's panel and the editor, not an empty table
