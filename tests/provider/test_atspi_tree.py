"""The accessibility tree's XML (providers/qemu/atspi_tree.py) from read nodes: OSWorld's form."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from providers.qemu import atspi_tree as T

SHOWN = ["showing", "visible", "enabled"]


def _editor() -> T.Node:
    return T.Node("application", "mousepad", states=[], children=[
        T.Node("frame", "notes.txt - Mousepad", states=[*SHOWN, "active"], extents=(0, 27, 1280, 773),
               attributes={"toolkit": "gtk"}, children=[
                   T.Node("push button", "Save", states=SHOWN, extents=(40, 60, 32, 32),
                          actions=[("click", "Clicks the button", "<Control>s")]),
                   T.Node("text", "", states=[*SHOWN, "editable", "multi_line"], extents=(0, 100, 1280, 700),
                          text='say "hi"\x00\ufffc'),
                   T.Node("scroll bar", "", states=["visible"], extents=(1270, 100, 10, 700),
                          value={"value": 0.0, "min": 0.0, "max": 1.0, "step": 0.1}),
               ])])


def test_nodes_become_elements_named_by_role_with_osworld_namespaces() -> None:
    root = ET.fromstring(T.to_xml([_editor()], 1 << 20))
    assert root.tag == "desktop-frame"
    app = root[0]
    assert app.tag == "application" and app.get("name") == "mousepad"
    frame = app[0]
    st, cp, attr = (f"{{{T.NS[p]}}}" for p in ("st", "cp", "attr"))
    assert frame.get(st + "active") == "true" and frame.get(st + "showing") == "true"
    assert frame.get(cp + "screencoord") == "(0, 27)" and frame.get(cp + "size") == "(1280, 773)"
    assert frame.get(attr + "toolkit") == "gtk"
    button, text, bar = frame
    assert button.tag == "push-button"
    assert button.get(f"{{{T.NS['act']}}}click_desc") == "Clicks the button"
    assert button.get(f"{{{T.NS['act']}}}click_kb") == "<Control>s"
    # The text interface's content, without what XML cannot carry or OSWorld drops.
    assert text.tag == "text" and text.text == 'say "hi"' and text.get(st + "multi_line") == "true"
    # Not showing: no position or size, as OSWorld gives none for it.
    assert bar.tag == "scroll-bar" and bar.get(cp + "screencoord") is None
    assert bar.get(f"{{{T.NS['val']}}}max") == "1.0" and bar.get(f"{{{T.NS['val']}}}step") == "0.1"


def test_depth_and_width_are_bounded_as_osworld_reads() -> None:
    deep = leaf = T.Node("panel")
    for _ in range(T.MAX_DEPTH + 10):
        child = T.Node("panel")
        leaf.children.append(child)
        leaf = child
    wide = T.Node("list", children=[T.Node("list item", str(i)) for i in range(T.MAX_WIDTH + 5)])
    root = ET.fromstring(T.to_xml([deep, wide], 1 << 24))
    depth, el = 0, root[0]
    while len(el):
        el, depth = el[0], depth + 1
    assert depth == T.MAX_DEPTH - 1  # the application is level 1
    assert len(root[1]) == T.MAX_WIDTH


def test_a_tree_over_the_cap_is_refused_not_cut() -> None:
    xml = T.to_xml([_editor()], 1 << 20)
    assert T.to_xml([_editor()], len(xml.encode())) == xml
    with pytest.raises(T.TooLarge):
        T.to_xml([_editor()], len(xml.encode()) - 1)


@pytest.mark.parametrize("role,tag", [("push button", "push-button"), ("", "unknown"), ("3d thing", "unknown"),
                                      ("table cell", "table-cell")])
def test_role_names_become_valid_tags(role: str, tag: str) -> None:
    assert T.tag_of(role) == tag


def test_the_reader_script_runs_this_file_in_the_guest_with_its_bounds() -> None:
    script = T.reader_script(4096, 30.5)
    first, *body, end, _ = script.split("\n")
    assert first == "exec timeout -k 2 30 python3 - 4096 <<'GH_ATSPI_TREE_EOF'" and end == "GH_ATSPI_TREE_EOF"
    assert "\n".join(body).strip() == open(T.__file__).read().strip()
