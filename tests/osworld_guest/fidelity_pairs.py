"""The file pairs on which gh_osworld's metrics are held against OSWorld's own (bench/osworld_fidelity.py
measures them against OSWorld's published package; test_fidelity.py checks them against the numbers it
recorded, tests/osworld_guest/fidelity_oracle.json).

    python3 tests/osworld_guest/fidelity_pairs.py make DIR      writes the files, prints the pairs (JSON)
    python3 tests/osworld_guest/fidelity_pairs.py ours DIR      our score of every pair, as the guest scores it

Both run on the guest's python3 (tests/osworld_guest/kit.py: Debian's modules and GUEST_SITE), so the files
come out byte for byte the same on every run (no randomness, no clock, but the `clock` pairs of the one
metric that reads it, whose files say "now": their numbers are the same on every run): the oracle file
records each file's sha256 and the test checks them first. Every metric gets at least an exact pair, a near one (a small
edit), a far one (another document) and a malformed one (the agent's file is no such document); a pair is

    {"id": "compare_images/near", "func": NAME, "result": FILE | null, "expected": FILE | null,
     "rules": {...} | null, "text": TEXT | null, "options": {...}}

FILE is relative to DIR; `rules` stands where OSWorld passes a rule dict as the expected value; `text`,
where it is set, is the result itself (a command's output: the vm_command_line getter prints it here);
`value`, where it is set, is the result as a getter of the machine's state gives it (JSON: Chrome's tabs,
a window's size), handed to ours by the rule getter; `read`: ours gets the result file's text.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import sys
import zipfile
from typing import Any

Pair = dict[str, Any]


def _write(root: str, name: str, data: bytes | str) -> str:
    path = os.path.join(root, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return name


def pair(pid: str, func: str, result: str | None, expected: str | None = None, *,
         rules: dict[str, Any] | None = None, text: str | None = None, options: dict[str, Any] | None = None,
         read: bool = False, value: Any = None, **more: Any) -> Pair:
    """`rules`: OSWorld's expected rule dict; `options` (or keywords): the metric's options. `read`: our
    getter hands the metric the result file's text where OSWorld's hands it the file (VLC's status).
    `value`: the result itself, a getter's JSON (Chrome's tabs, bookmarks, ...), where it is not None."""
    return {"id": pid, "func": func, "result": result, "expected": expected, "rules": rules, "text": text,
            "read": read, "value": value, "options": {**(options or {}), **more}}


# -- images --

def _picture(seed: int, size: tuple[int, int] = (96, 64)) -> Any:
    """A picture with gradients, bars and a disc, different for every seed."""
    import numpy as np

    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    r = (x * (3 + seed) + y * 2) % 256
    g = ((x - w / 2) ** 2 + (y - h / 2) ** 2 < (h / (3 + seed % 3)) ** 2) * 200 + 30
    b = ((x // (8 + seed)) % 2) * 180 + (y * 3) % 60
    return np.stack([r, g, b], axis=-1).astype("uint8")


def _noisy(a: Any, amount: int) -> Any:
    """A deterministic ripple added to every pixel (no random generator: the same bytes on every host)."""
    import numpy as np

    h, w = a.shape[:2]
    y, x = np.mgrid[0:h, 0:w]
    ripple = ((x * 7 + y * 13) % (2 * amount + 1)) - amount
    if a.ndim == 3:
        ripple = ripple[..., None]
    return np.clip(a.astype(int) + ripple, 0, 255).astype("uint8")


def _png(image: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _image_pairs(root: str) -> list[Pair]:
    from PIL import Image, ImageEnhance

    base = Image.fromarray(_picture(0))
    other = Image.fromarray(_picture(5))
    files = {
        "img/base.png": _png(base),
        "img/near.png": _png(Image.fromarray(_noisy(_picture(0), 6))),
        "img/far.png": _png(other),
        "img/bad.png": b"\x89PNG\r\n\x1a\n not really a picture",
        "img/gray.png": _png(base.convert("L")),
        "img/gray_near.png": _png(Image.fromarray(_noisy(_picture(0), 12)).convert("L")),
        "img/palette.png": _png(base.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)),
        "img/rgba.png": _png(Image.fromarray(_noisy(_picture(0), 3)).convert("RGBA")),
        "img/small.png": _png(base.resize((48, 32))),
        "img/tiny.png": _png(base.resize((5, 5))),
        "img/dark.png": _png(ImageEnhance.Brightness(base).enhance(0.6)),
        "img/bright.png": _png(ImageEnhance.Brightness(base).enhance(1.3)),
        "img/contrast.png": _png(ImageEnhance.Contrast(base).enhance(1.5)),
        "img/flat.png": _png(ImageEnhance.Contrast(base).enhance(0.5)),
        "img/saturated.png": _png(ImageEnhance.Color(base).enhance(1.6)),
        "img/saturated_a_little.png": _png(ImageEnhance.Color(base).enhance(1.1)),
        "img/palette256.png": _png(base.convert("P", palette=Image.Palette.ADAPTIVE, colors=256)),
        "img/dull.png": _png(ImageEnhance.Color(base).enhance(0.4)),
    }
    jpeg = io.BytesIO()
    base.save(jpeg, format="JPEG", quality=90)
    files["img/base.jpg"] = jpeg.getvalue()
    for name, data in files.items():
        _write(root, name, data)
    pairs = [
        pair("compare_images/exact", "compare_images", "img/base.png", "img/base.png"),
        pair("compare_images/near-jpeg", "compare_images", "img/base.jpg", "img/base.png"),
        pair("compare_images/near", "compare_images", "img/near.png", "img/base.png"),
        pair("compare_images/far", "compare_images", "img/far.png", "img/base.png"),
        pair("compare_images/smaller", "compare_images", "img/small.png", "img/base.png"),
        pair("compare_images/gray", "compare_images", "img/gray_near.png", "img/base.png"),
        pair("compare_images/base-score", "compare_images", "img/near.png", "img/base.png",
             reference_base_result=0.5),
        pair("compare_images/base-score-above", "compare_images", "img/far.png", "img/base.png",
             reference_base_result=0.99),
        pair("compare_images/missing", "compare_images", None, "img/base.png"),
        pair("compare_images/tiny", "compare_images", "img/tiny.png", "img/tiny.png"),
    ]
    ssim_cases = [("exact", "img/base.png", "img/base.png"), ("near", "img/near.png", "img/base.png"),
                  ("far", "img/far.png", "img/base.png"), ("gray", "img/gray_near.png", "img/gray.png"),
                  ("palette", "img/palette.png", "img/base.png"), ("rgba", "img/rgba.png", "img/base.png"),
                  ("palette256", "img/palette256.png", "img/base.png"),
                  ("smaller", "img/small.png", "img/base.png"), ("tiny", "img/tiny.png", "img/tiny.png"),
                  ("missing", None, "img/base.png")]
    for func in ("check_structure_sim", "check_structure_sim_resized", "check_file_exists_and_structure_sim",
                 "check_palette_and_structure_sim"):
        pairs += [pair(f"{func}/{name}", func, r, e) for name, r, e in ssim_cases]
    for func, up, down in (("check_brightness_decrease_and_structure_sim", "img/dark.png", "img/bright.png"),
                           ("check_contrast_increase_and_structure_sim", "img/contrast.png", "img/flat.png"),
                           ("check_saturation_increase_and_structure_sim", "img/saturated.png", "img/dull.png")):
        pairs += [pair(f"{func}/right", func, up, "img/base.png"),
                  pair(f"{func}/wrong-way", func, down, "img/base.png"),
                  pair(f"{func}/unchanged", func, "img/base.png", "img/base.png"),
                  pair(f"{func}/far", func, "img/far.png", "img/base.png"),
                  pair(f"{func}/gray", func, "img/gray_near.png", "img/gray.png"),
                  pair(f"{func}/palette", func, "img/palette.png", "img/base.png")]
    func = "check_saturation_increase_and_structure_sim"
    pairs.append(pair(f"{func}/a-little", func, "img/saturated_a_little.png", "img/base.png"))
    return pairs


def _more_image_pairs(root: str) -> list[Pair]:
    """GIMP's other image checks: mirror, green background, size, file size, the triangle, image lists."""
    import numpy as np
    from PIL import Image, ImageDraw

    base = Image.fromarray(_picture(0))
    mirrored = base.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    square = np.zeros((40, 40, 3), dtype="uint8")
    square[10:30, 10:30] = (200, 40, 40)  # the subject, red
    mask = square.copy()  # the target: black where the background is
    green = square.copy()
    green[mask.sum(axis=2) == 0] = (20, 180, 30)
    half_green = green.copy()
    half_green[:, :20][mask[:, :20].sum(axis=2) == 0] = (90, 90, 200)

    def triangle(cx: int, cy: int, shadow: bool = False) -> Any:
        image = Image.new("RGB", (80, 60), (255, 255, 255))
        draw = ImageDraw.Draw(image)
        if shadow:  # a third colour, rarer than the triangle
            draw.rectangle([0, 0, 3, 3], fill=(10, 10, 10))
        draw.polygon([(cx - 8, cy + 6), (cx + 8, cy + 6), (cx, cy - 8)], fill=(250, 210, 0))
        return image

    files = {"img2/mirrored.png": _png(mirrored), "img2/mirrored_near.png": _png(Image.fromarray(_noisy(
                 np.asarray(mirrored), 4))),
             "img2/mask.png": _png(Image.fromarray(mask)), "img2/green.png": _png(Image.fromarray(green)),
             "img2/half_green.png": _png(Image.fromarray(half_green)),
             "img2/centred.png": _png(triangle(40, 30)), "img2/off_centre.png": _png(triangle(15, 12)),
             "img2/centred3.png": _png(triangle(40, 30, True)), "img2/off_centre3.png": _png(triangle(15, 12, True))}
    for name, data in files.items():
        _write(root, name, data)
    pairs = [pair(f"check_image_mirror/{n}", "check_image_mirror", r, "img/base.png") for n, r in
             (("exact", "img2/mirrored.png"), ("near", "img2/mirrored_near.png"), ("far", "img/base.png"),
              ("malformed", "img/bad.png"), ("missing", None))]
    pairs += [pair(f"check_green_background/{n}", "check_green_background", r, e) for n, r, e in
              (("exact", "img2/green.png", "img2/mask.png"), ("near", "img2/half_green.png", "img2/mask.png"),
               ("far", "img2/mask.png", "img2/mask.png"), ("not-square", "img/base.png", "img/base.png"),
               ("malformed", "img/bad.png", "img2/mask.png"))]
    pairs += [pair(f"check_image_size/{n}", "check_image_size", r, rules=rules) for n, r, rules in
              (("exact", "img/base.png", {"width": 96, "height": 64}), ("height-only", "img/base.png", {"height": 64}),
               ("near", "img/base.png", {"width": 95, "height": 64}), ("far", "img/small.png", {"width": 96}),
               ("alpha", "img/rgba.png", {"width": 96, "height": 64, "ignore_transparent": True}),
               ("missing", None, {"width": 96}))]
    f = "check_image_file_size"
    pairs += [pair(f"{f}/{n}", f, r, rules={"max_size": size}) for n, r, size in
              (("under", "img/small.png", 500_000), ("over", "img/base.png", 100), ("far", "img/base.jpg", 10),
               ("missing", None, 500_000))]
    pairs += [pair(f"check_triangle_position/{n}", "check_triangle_position", r) for n, r in
              (("exact", "img2/centred.png"), ("far", "img2/off_centre.png"), ("missing", None),
               ("three-colours", "img2/centred3.png"), ("three-colours-off", "img2/off_centre3.png"),
               ("picture", "img/base.png"))]
    pairs += [pair(f"compare_image_list/{n}", "compare_image_list", r, e) for n, r, e in
              (("exact", "img/base.png", "img/base.png"), ("near", "img/near.png", "img/base.png"),
               ("resized", "img/small.png", "img/base.png"), ("mode", "img/palette256.png", "img/base.png"),
               ("malformed", "img/bad.png", "img/base.png"))]
    return pairs


# -- PDFs, written by hand (the guest has no PDF writer) --

def _pdf(pages: list[list[str]]) -> bytes:
    """A PDF of Helvetica lines, one list of lines per page."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", "",
               "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"]
    kids = []
    for lines in pages:
        body = ["BT /F1 12 Tf 72 740 Td 16 TL"]
        for line in lines:
            text = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            body.append(f"({text}) Tj T*")
        body.append("ET")
        stream = "\n".join(body).encode("latin-1")
        objects.append(f"<< /Length {len(stream)} >>\nstream\n" + stream.decode("latin-1") + "\nendstream")
        content = len(objects)
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {content} 0 R "
                       "/Resources << /Font << /F1 3 0 R >> >> >>")
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, body_text in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n{body_text}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for off in offsets:
        out += f"{off:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


INVOICE = [["Invoice 2024-117", "Customer: Harbour Supplies Ltd", "Item  Qty  Price",
            "Rope 20 m  3  45.00", "Anchor  1  310.00", "Total due: 445.00"],
           ["Terms: thirty days net", "Thank you for your business"]]


def _pdf_pairs(root: str) -> list[Pair]:
    near = [list(p) for p in INVOICE]
    near[0][5] = "Total due: 446.00"
    files = {"pdf/gold.pdf": _pdf(INVOICE), "pdf/near.pdf": _pdf(near),
             "pdf/far.pdf": _pdf([["Minutes of the annual meeting", "Present: seven members"]]),
             "pdf/one_page.pdf": _pdf(INVOICE[:1]), "pdf/bad.pdf": b"%PDF-1.4\nthis is not a PDF body\n",
             "pdf/gold2.pdf": _pdf([["Second report", "All figures final"]])}
    for name, data in files.items():
        _write(root, name, data)
    return [pair("compare_pdfs/exact", "compare_pdfs", "pdf/gold.pdf", "pdf/gold.pdf"),
            pair("compare_pdfs/near", "compare_pdfs", "pdf/near.pdf", "pdf/gold.pdf"),
            pair("compare_pdfs/page-missing", "compare_pdfs", "pdf/one_page.pdf", "pdf/gold.pdf"),
            pair("compare_pdfs/far", "compare_pdfs", "pdf/far.pdf", "pdf/gold.pdf"),
            pair("compare_pdfs/malformed", "compare_pdfs", "pdf/bad.pdf", "pdf/gold.pdf")]


# -- text, archives, books, databases --

POEM = "".join(f"line {i}: the quick brown fox {'jumps' if i % 3 else 'naps'}\n" for i in range(40))


def _text_pairs(root: str) -> list[Pair]:
    _write(root, "txt/gold.txt", POEM)
    _write(root, "txt/near.txt", POEM.replace("line 7:", "line seven:"))
    _write(root, "txt/far.txt", "nothing alike\nat all\n")
    _write(root, "txt/bad.txt", b"\xff\xfe\x00binary\x80\x81")
    _write(root, "txt/empty.txt", "")
    _write(root, "txt/repeats.txt", "same\n" * 300 + "end\n")
    return [pair("diff_text_file/exact", "diff_text_file", "txt/gold.txt", "txt/gold.txt"),
            pair("diff_text_file/near", "diff_text_file", "txt/near.txt", "txt/gold.txt"),
            pair("diff_text_file/far", "diff_text_file", "txt/far.txt", "txt/gold.txt"),
            pair("diff_text_file/malformed", "diff_text_file", "txt/bad.txt", "txt/gold.txt"),
            pair("diff_text_file/empty", "diff_text_file", "txt/empty.txt", "txt/empty.txt"),
            pair("diff_text_file/repeats", "diff_text_file", "txt/repeats.txt", "txt/repeats.txt")]


def _string_pairs(root: str) -> list[Pair]:
    want = "Harbour Supplies Ltd"
    pairs = []
    for func, rules in (("fuzzy_match", {"expected": want}), ("exact_match", {"expected": want}),
                        ("check_include_exclude", {"include": ["Harbour", "Ltd"], "exclude": ["Inc"]})):
        pairs += [pair(f"{func}/exact", func, None, rules=rules, text=want),
                  pair(f"{func}/near", func, None, rules=rules, text="Harbor Supplies Ltd"),
                  pair(f"{func}/far", func, None, rules=rules, text="Minutes of the meeting Inc"),
                  pair(f"{func}/empty", func, None, rules=rules, text="")]
    return pairs


TIMEDATECTL = ("               Local time: Thu 2024-01-25 12:56:06 {zone}\n"
               "           Universal time: Thu 2024-01-25 12:56:06 UTC\n"
               "                 RTC time: Thu 2024-01-25 12:56:05\n"
               "                Time zone: {name} ({zone}, {offset})\n"
               "System clock synchronized: yes\n")


def _os_text_pairs(root: str) -> list[Pair]:
    """The OS domain's metrics of a command's output."""
    utc = TIMEDATECTL.format(zone="UTC", name="Etc/UTC", offset="+0000")
    faroe = TIMEDATECTL.format(zone="WET", name="Atlantic/Faroe", offset="+0000")
    berlin = TIMEDATECTL.format(zone="CET", name="Europe/Berlin", offset="+0100")
    pairs = [pair(f"is_utc_0/{n}", "is_utc_0", None, text=t) for n, t in
             (("exact", utc), ("same-offset", faroe), ("far", berlin), ("short", "Local time: now\n"))]
    pairs += [pair(f"check_text_enlarged/{n}", "check_text_enlarged", None, text=t) for n, t in
              (("exact", "1.25"), ("near", "1.0"), ("far", "0.8"), ("padded", " 1.5\n"))]
    want = {"expected": ["thunderbird.desktop", "vim.desktop"]}
    f = "check_gnome_favorite_apps"
    pairs += [pair(f"{f}/{n}", f, None, rules=want, text=t) for n, t in
              (("exact", "['vim.desktop', 'thunderbird.desktop']"), ("near", "['vim.desktop']"),
               ("far", "['a.desktop', 'b.desktop']"), ("empty", "@as []"))]
    return pairs


def _text_file_pairs(root: str) -> list[Pair]:
    _write(root, "txt/spaced.txt", POEM.replace("the quick", "the   quick").upper())
    f = "compare_text_file"
    pairs = [pair(f"{f}/exact", f, "txt/gold.txt", "txt/gold.txt"),
             pair(f"{f}/near", f, "txt/near.txt", "txt/gold.txt"),
             pair(f"{f}/far", f, "txt/far.txt", "txt/gold.txt"),
             pair(f"{f}/malformed", f, "txt/bad.txt", "txt/gold.txt"),
             pair(f"{f}/blanks-case", f, "txt/spaced.txt", "txt/gold.txt", ignore_blanks=True, ignore_case=True),
             pair(f"{f}/blanks-only", f, "txt/spaced.txt", "txt/gold.txt", ignore_blanks=True)]
    rows = "name,qty,price\nrope,3,45.00\nanchor,1,310.00\n"
    _write(root, "csv/gold.csv", rows)
    _write(root, "csv/near.csv", rows.replace("310.00", "310"))
    _write(root, "csv/far.csv", "a,b\n1,2\n")
    _write(root, "csv/crlf.csv", rows.replace("\n", "\r\n"))
    _write(root, "csv/bad.csv", b"\xff\xfe\x00\x81,\x80")
    f = "compare_csv"
    pairs += [pair(f"{f}/exact", f, "csv/gold.csv", "csv/gold.csv"),
              pair(f"{f}/near", f, "csv/near.csv", "csv/gold.csv"),
              pair(f"{f}/far", f, "csv/far.csv", "csv/gold.csv"),
              pair(f"{f}/crlf", f, "csv/crlf.csv", "csv/gold.csv"),
              pair(f"{f}/malformed", f, "csv/bad.csv", "csv/gold.csv")]
    return pairs


def _rule_file_pairs(root: str) -> list[Pair]:
    """Metrics of one file the agent left and a rule dict: JSON, config text, lists, counts."""
    settings = {"editor": {"fontSize": 14, "wordWrap": "on"}, "files": {"exclude": ["*.tmp"]}}
    _write(root, "json/right.json", json.dumps(settings))
    _write(root, "json/near.json", json.dumps({**settings, "editor": {"fontSize": 13, "wordWrap": "on"}}))
    _write(root, "json/far.json", json.dumps(["not", "an", "object"]))
    _write(root, "json/bad.json", "{editor: 14,")
    expect = {"expect": [{"key": ["editor", "fontSize"], "method": "eq", "ref": 14},
                         {"key": ["editor", "wordWrap"], "method": "re", "ref": "^on$"}],
              "unexpect": [{"key": ["files", "watcher"], "method": "eq", "ref": True}]}
    f = "check_json"
    pairs = [pair(f"{f}/exact", f, "json/right.json", rules=expect),
             pair(f"{f}/near", f, "json/near.json", rules=expect),
             pair(f"{f}/far", f, "json/far.json", rules=expect),
             pair(f"{f}/malformed", f, "json/bad.json", rules=expect),
             pair(f"{f}/missing", f, None, rules=expect)]
    config = "[core]\n\tautocrlf = input\n"
    _write(root, "conf/right.conf", config)
    _write(root, "conf/near.conf", config.replace("input", "true"))
    _write(root, "conf/far.conf", "nothing\n")
    f = "compare_config"
    pairs += [pair(f"{f}/exact", f, "conf/right.conf", rules={"expected": config}),
              pair(f"{f}/near", f, "conf/near.conf", rules={"expected": config}),
              pair(f"{f}/far", f, "conf/far.conf", rules={"expected": config}),
              pair(f"{f}/malformed", f, "txt/bad.txt", rules={"expected": config})]
    f = "file_contains"
    want = {"expected": ["line 7:", "naps"]}
    pairs += [pair(f"{f}/exact", f, "txt/gold.txt", rules=want),
              pair(f"{f}/near", f, "txt/near.txt", rules=want),
              pair(f"{f}/far", f, "txt/far.txt", rules=want),
              pair(f"{f}/malformed", f, "txt/bad.txt", rules=want)]
    _write(root, "txt/times.txt", "started 09:15:00\nfinished 23:59:60\nbad 24:00:00\nlunch 12:30:15 ok\n")
    f = "check_line_number"
    pairs += [pair(f"{f}/exact", f, "txt/times.txt", rules={"expected": "3"}),
              pair(f"{f}/near", f, "txt/times.txt", rules={"expected": "4"}),
              pair(f"{f}/far", f, "txt/gold.txt", rules={"expected": "3"}),
              pair(f"{f}/malformed", f, "txt/bad.txt", rules={"expected": "3"})]
    _write(root, "csv/people.csv", "name,city\nAna,Lisbon\nBo,Oslo\n")
    csv_rules = {"expect": [{"name": "Ana", "city": "Lisbon"}, {"name": "Bo"}], "unexpect": [{"city": "Rome"}]}
    f = "check_csv"
    pairs += [pair(f"{f}/exact", f, "csv/people.csv", rules=csv_rules),
              pair(f"{f}/near", f, "csv/people.csv", rules={**csv_rules, "unexpect": [{"city": "Oslo"}]}),
              pair(f"{f}/far", f, "csv/far.csv", rules=csv_rules),
              pair(f"{f}/malformed", f, "txt/bad.txt", rules=csv_rules),
              pair(f"{f}/missing", f, None, rules=csv_rules)]
    list_rules = {"expect": [r"^line 1:", r"naps$"], "unexpect": [r"sleeps"]}
    f = "check_list"
    pairs += [pair(f"{f}/exact", f, "txt/gold.txt", rules=list_rules),
              pair(f"{f}/near", f, "txt/gold.txt", rules={**list_rules, "unexpect": ["line 39"]}),
              pair(f"{f}/far", f, "txt/far.txt", rules=list_rules),
              pair(f"{f}/malformed", f, "txt/bad.txt", rules=list_rules)]
    f = "check_json_settings"
    want_settings = {"expected": {"editor": {"fontSize": 14, "wordWrap": "on"}}}
    pairs += [pair(f"{f}/exact", f, "json/right.json", rules=want_settings),
              pair(f"{f}/near", f, "json/near.json", rules=want_settings),
              pair(f"{f}/far", f, "json/far.json", rules=want_settings),
              pair(f"{f}/malformed", f, "json/bad.json", rules=want_settings)]
    xcu = ('<?xml version="1.0" encoding="UTF-8"?>\n<oor:items xmlns:oor="http://openoffice.org/2001/registry">\n'
           '<item oor:path="/org.openoffice.Office.Writer/DefaultFont"><prop oor:name="Standard" oor:op="fuse">'
           '<value>{font}</value></prop></item>\n</oor:items>\n')
    _write(root, "conf/times.xcu", xcu.format(font="Times New Roman"))
    _write(root, "conf/arial.xcu", xcu.format(font="Arial"))
    _write(root, "conf/empty.xcu",
           '<?xml version="1.0"?>\n<oor:items xmlns:oor="http://openoffice.org/2001/registry"/>\n')
    f = "find_default_font"
    times = {"font_name": "Times New Roman"}
    pairs += [pair(f"{f}/exact", f, "conf/times.xcu", rules=times), pair(f"{f}/near", f, "conf/arial.xcu", rules=times),
              pair(f"{f}/far", f, "conf/empty.xcu", rules=times), pair(f"{f}/malformed", f, "txt/bad.txt", rules=times)]
    _write(root, "conf/gimprc", "# GIMP gimprc\n\n(undo-levels 100)\n(history-item \"filters-vignette\" 1)\n"
                                "(theme \"Dark\")\n")
    f = "check_config_status"
    pairs += [pair(f"{f}/exact", f, "conf/gimprc", rules={"key": "undo-levels", "value": "100"}),
              pair(f"{f}/two-words", f, "conf/gimprc", rules={"key": ["history-item", "\"filters-vignette\""],
                                                               "value": "1"}),
              pair(f"{f}/near", f, "conf/gimprc", rules={"key": "undo-levels", "value": "10"}),
              pair(f"{f}/far", f, "txt/far.txt", rules={"key": "undo-levels", "value": "100"}),
              pair(f"{f}/missing", f, None, rules={"key": "undo-levels", "value": "100"})]
    f = "is_in_list"
    pairs += [pair(f"{f}/exact", f, None, rules={"expected": "b"}, text="abc"),
              pair(f"{f}/near", f, None, rules={"expected": "bd"}, text="abc"),
              pair(f"{f}/far", f, None, rules={"expected": "z"}, text="abc"),
              pair(f"{f}/empty", f, None, rules={"expected": "b"}, text="")]
    return pairs


def _file_file_pairs(root: str) -> list[Pair]:
    """Metrics of two files: Python sources, result files, zips."""
    source = "#!/usr/bin/env python3\nimport sys\n\n\ndef main():\n\tprint('hi')\n"
    _write(root, "py/gold.py", source)
    _write(root, "py/spaced.py", source.replace("\t", "    ").replace("#!/usr/bin/env python3\n", "") + "\n\n")
    _write(root, "py/near.py", source.replace("hi", "hello"))
    _write(root, "py/far.py", "x = 1\n")
    f = "compare_python_pure_text"
    pairs = [pair(f"{f}/exact", f, "py/gold.py", "py/gold.py"),
             pair(f"{f}/reformatted", f, "py/spaced.py", "py/gold.py"),
             pair(f"{f}/near", f, "py/near.py", "py/gold.py"),
             pair(f"{f}/far", f, "py/far.py", "py/gold.py"),
             pair(f"{f}/malformed", f, "txt/bad.txt", "py/gold.py")]
    _write(root, "res/gold.txt", "42.5\n")
    _write(root, "res/said.txt", "The answer is 42.5\n")
    _write(root, "res/close.txt", "42.50001")
    _write(root, "res/far.txt", "17")
    f = "compare_result_files"
    pairs += [pair(f"{f}/exact", f, "res/gold.txt", "res/gold.txt"),
              pair(f"{f}/superset", f, "res/said.txt", "res/gold.txt"),
              pair(f"{f}/near", f, "res/close.txt", "res/gold.txt"),
              pair(f"{f}/far", f, "res/far.txt", "res/gold.txt"),
              pair(f"{f}/malformed", f, "txt/bad.txt", "res/gold.txt")]
    f = "compare_zip_files"
    pairs += [pair(f"{f}/exact", f, "zip/gold.zip", "zip/gold.zip"),
              pair(f"{f}/near", f, "zip/near.zip", "zip/gold.zip"),
              pair(f"{f}/far", f, "zip/far.zip", "zip/gold.zip"),
              pair(f"{f}/pdf-near", f, "zip/pdfs_near.zip", "zip/pdfs.zip"),
              pair(f"{f}/malformed", f, "zip/bad.zip", "zip/gold.zip")]
    return pairs


def _zip(members: dict[str, str | bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            z.writestr(info, data)
    return out.getvalue()


def _archive_pairs(root: str) -> list[Pair]:
    gold = {"a.txt": "alpha\nbeta\n", "b.txt": "gamma\n", "c.txt": "delta\nepsilon\n"}
    _write(root, "zip/gold.zip", _zip(gold))
    _write(root, "zip/near.zip", _zip({**gold, "b.txt": "GAMMA\n"}))
    _write(root, "zip/far.zip", _zip({"x.txt": "other\n"}))
    _write(root, "zip/nested_gold.zip", _zip({f"notes/{n}": t for n, t in gold.items()}))
    _write(root, "zip/nested_near.zip", _zip({f"notes/{n}": t for n, t in {**gold, "c.txt": "delta\n"}.items()}))
    _write(root, "zip/bad.zip", b"PK\x03\x04 broken")
    _write(root, "zip/pdfs.zip", _zip({"a.pdf": _pdf(INVOICE), "b.pdf": _pdf([["Second report"]])}))
    near_pdf = [list(p) for p in INVOICE]
    near_pdf[0][1] = "Customer: Harbor Supplies Ltd"
    _write(root, "zip/pdfs_near.zip", _zip({"a.pdf": _pdf(near_pdf), "b.pdf": _pdf([["Second report"]])}))
    return [pair("compare_archive/exact", "compare_archive", "zip/gold.zip", "zip/gold.zip"),
            pair("compare_archive/near", "compare_archive", "zip/near.zip", "zip/gold.zip"),
            pair("compare_archive/far", "compare_archive", "zip/far.zip", "zip/gold.zip"),
            pair("compare_archive/malformed", "compare_archive", "zip/bad.zip", "zip/gold.zip"),
            pair("compare_archive/inner", "compare_archive", "zip/nested_near.zip", "zip/nested_gold.zip",
                 file_path="notes"),
            pair("compare_archive/nested-no-path", "compare_archive", "zip/nested_near.zip",
                 "zip/nested_gold.zip"),
            pair("compare_archive/pdf-near", "compare_archive", "zip/pdfs_near.zip", "zip/pdfs.zip",
                 file_type="pdf")]


def _book(chapters: dict[str, str], title: str = "Sea Stories") -> bytes:
    toc = ("<?xml version='1.0' encoding='utf-8'?>\n<ncx>\n<docTitle><text>" + title + "</text></docTitle>\n"
           + "".join(f"<navPoint id='n{i}'><content src='{n}'/></navPoint>\n" for i, n in enumerate(chapters))
           + "</ncx>\n")
    opf = ("<?xml version='1.0' encoding='utf-8'?>\n<package>\n<metadata>\n<dc:title>" + title + "</dc:title>\n"
           "<dc:identifier>urn:uuid:1234</dc:identifier>\n</metadata>\n</package>\n")
    return _zip({"mimetype": "application/epub+zip", "toc.ncx": toc, "content.opf": opf, **chapters})


def _epub_pairs(root: str) -> list[Pair]:
    chapters = {"ch1.html": "<html><body>\n<h1>One</h1>\n<p>The ship sailed at dawn.</p>\n</body></html>",
                "ch2.html": "<html><body>\n<h1>Two</h1>\n<p>The storm came at noon.</p>\n<p>All hands.</p>"
                            "\n</body></html>"}
    _write(root, "epub/gold.epub", _book(chapters))
    _write(root, "epub/near.epub", _book({**chapters, "ch2.html": chapters["ch2.html"].replace("noon", "dusk")}))
    _write(root, "epub/far.epub", _book({"ch1.html": "<html><body><p>Other</p></body></html>"}, "Other"))
    _write(root, "epub/bad.epub", b"not a zip at all")
    return [pair("compare_epub/exact", "compare_epub", "epub/gold.epub", "epub/gold.epub"),
            pair("compare_epub/near", "compare_epub", "epub/near.epub", "epub/gold.epub"),
            pair("compare_epub/far", "compare_epub", "epub/far.epub", "epub/gold.epub"),
            pair("compare_epub/malformed", "compare_epub", "epub/bad.epub", "epub/gold.epub")]


def _sqlite_pairs(root: str) -> list[Pair]:
    os.makedirs(os.path.join(root, "db"), exist_ok=True)
    for name, done in (("db/half.db", [1, 0]), ("db/all.db", [1, 1])):
        path = os.path.join(root, name)
        if os.path.exists(path):
            os.remove(path)
        with sqlite3.connect(path) as c:
            c.execute("create table tasks (name text, done int)")
            c.executemany("insert into tasks values (?, ?)", [(f"t{i}", d) for i, d in enumerate(done)])
        c.close()
    _write(root, "db/bad.db", b"SQLite format 3\x00 but nothing else")
    share = {"sql": "select avg(done) from tasks"}
    return [pair("run_sqlite3/exact", "run_sqlite3", "db/all.db", rules=share),
            pair("run_sqlite3/near", "run_sqlite3", "db/half.db", rules=share),
            pair("run_sqlite3/far", "run_sqlite3", "db/half.db",
                 rules={"sql": "select count(*) from tasks where done = 2"}),
            pair("run_sqlite3/null", "run_sqlite3", "db/half.db",
                 rules={"sql": "select max(done) from tasks where name = 'none'"}),
            pair("run_sqlite3/no-row", "run_sqlite3", "db/half.db",
                 rules={"sql": "select done from tasks where name = 'none'"}),
            pair("run_sqlite3/malformed", "run_sqlite3", "db/bad.db", rules=share)]


# -- documents --

LETTER = ["Dear Ms Alvarez,", "Thank you for your order of 12 March.", "",
          "The parcel leaves our warehouse on Friday.", "Kind regards,", "Tom"]


def _docx(paragraphs: list[str]) -> bytes:
    import datetime

    from docx import Document

    doc = Document()
    for text in paragraphs:
        doc.add_paragraph(text)
    when = datetime.datetime(2024, 1, 1)
    doc.core_properties.created = doc.core_properties.modified = when
    out = io.BytesIO()
    doc.save(out)
    return _restamped(out.getvalue())


def _linked_docx() -> bytes:
    """LETTER with its last line's name as a hyperlink ("Tom" linked to a page)."""
    import datetime

    from docx import Document
    from docx.opc.constants import RELATIONSHIP_TYPE
    from docx.oxml import OxmlElement
    from docx.oxml.ns import qn

    doc = Document()
    for text in LETTER[:-1]:
        doc.add_paragraph(text)
    p = doc.add_paragraph()
    link = OxmlElement("w:hyperlink")
    link.set(qn("r:id"), p.part.relate_to("https://example.org/tom", RELATIONSHIP_TYPE.HYPERLINK, is_external=True))
    run, text = OxmlElement("w:r"), OxmlElement("w:t")
    text.text = LETTER[-1]
    run.append(text)
    link.append(run)
    p._p.append(link)
    doc.core_properties.created = doc.core_properties.modified = datetime.datetime(2024, 1, 1)
    out = io.BytesIO()
    doc.save(out)
    return _restamped(out.getvalue())


def _docx_pairs(root: str) -> list[Pair]:
    near = list(LETTER)
    near[1] = "Thank you for your ordr of 12 March."
    _write(root, "docx/gold.docx", _docx(LETTER))
    _write(root, "docx/near.docx", _docx(near))
    _write(root, "docx/far.docx", _docx(["Minutes", "Nothing was decided."]))
    _write(root, "docx/blanks.docx", _docx([p for p in LETTER if p]))
    _write(root, "docx/bad.docx", b"PK\x03\x04 not a document")
    _write(root, "docx/linked.docx", _linked_docx())
    f = "compare_docx_files"
    # python-docx 1.x reads a hyperlink's text and a page break as OSWorld does; 0.8.11 does not
    pairs = [pair(f"{f}/hyperlink", f, "docx/linked.docx", "docx/gold.docx"),
             pair(f"{f}/strict-page-break", f, "fmt/no_break.docx", "fmt/gold.docx", ignore_blanks=False)]
    for label, options in (("", {}), ("content_only/", {"content_only": True}),
                           ("fuzzy/", {"fuzzy_match": True, "ignore_blanks": False})):
        f = "compare_docx_files"
        pairs += [pair(f"{f}/{label}exact", f, "docx/gold.docx", "docx/gold.docx", **options),
                  pair(f"{f}/{label}near", f, "docx/near.docx", "docx/gold.docx", **options),
                  pair(f"{f}/{label}blanks", f, "docx/blanks.docx", "docx/gold.docx", **options),
                  pair(f"{f}/{label}far", f, "docx/far.docx", "docx/gold.docx", **options),
                  pair(f"{f}/{label}malformed", f, "docx/bad.docx", "docx/gold.docx", **options)]
    f = "compare_docx_files_and_ignore_new_lines"
    pairs += [pair(f"{f}/exact", f, "docx/gold.docx", "docx/gold.docx"),
              pair(f"{f}/blanks", f, "docx/blanks.docx", "docx/gold.docx"),
              pair(f"{f}/near", f, "docx/near.docx", "docx/gold.docx"),
              pair(f"{f}/far", f, "docx/far.docx", "docx/gold.docx"),
              pair(f"{f}/malformed", f, "docx/bad.docx", "docx/gold.docx")]
    return pairs


def _formatted_docx(*, centered: bool = True, subscript: bool = True, spacing: float = 1.5, cell: str = "2",
                    strike: bool = True, italic_pt: int = 14, page_break: bool = True, footer: str = "Page 1",
                    font: str = "Liberation Serif") -> bytes:
    """A document with the formatting the docx metrics look at; each keyword changes one of them."""
    import datetime

    from docx import Document
    from docx.enum.text import WD_ALIGN_PARAGRAPH, WD_BREAK
    from docx.shared import Pt

    doc = Document()
    title = doc.add_paragraph()
    title.add_run("Annual Report").font.name = font
    if centered:
        title.alignment = WD_ALIGN_PARAGRAPH.CENTER
    water = doc.add_paragraph()
    for text, sub in (("H", False), ("2", subscript), ("O is water", False)):
        r = water.add_run(text)
        r.font.name = font
        r.font.subscript = sub
    body = doc.add_paragraph()
    body.add_run("Sales rose in every region.").font.name = font
    body.paragraph_format.line_spacing = spacing
    note = doc.add_paragraph()
    r = note.add_run("Note")
    r.italic, r.font.size, r.font.name = True, Pt(italic_pt), font
    table = doc.add_table(rows=2, cols=2)
    for (i, j), text in zip([(0, 0), (0, 1), (1, 0), (1, 1)], ["A", "B", "1", cell], strict=True):
        table.cell(i, j).text = text
    brk = doc.add_paragraph()
    run = brk.add_run("End of part one")
    run.font.name = font
    if page_break:
        run.add_break(WD_BREAK.PAGE)
    last = doc.add_paragraph()
    r = last.add_run("Old text")
    r.font.strike, r.font.name = strike, font
    doc.sections[0].footer.paragraphs[0].text = footer
    doc.core_properties.created = doc.core_properties.modified = datetime.datetime(2024, 1, 1)
    out = io.BytesIO()
    doc.save(out)
    return _restamped(out.getvalue())


def _doc_bytes(build: Any) -> bytes:
    """A document `build(doc)` fills, stamped with fixed times."""
    import datetime

    from docx import Document

    doc = Document()
    build(doc)
    doc.core_properties.created = doc.core_properties.modified = datetime.datetime(2024, 1, 1)
    out = io.BytesIO()
    doc.save(out)
    return _restamped(out.getvalue())


REFERENCES = ["Smith, J. (2019). Tides of the North Sea. Ocean Press.",
              "Okafor, A. (2021). Harbour engineering today. Port Journal 12(3).",
              "Lindqvist, M. (2020). Ropes and knots. Maritime Books."]


def _docx_content_pairs(root: str) -> list[Pair]:
    """compare_references (a fractional score), colour-coded table words, pictures in documents."""
    from docx.shared import Inches, RGBColor

    def paper(refs: list[str], heading: str = "References") -> Any:
        def build(doc: Any) -> None:
            doc.add_paragraph("A study of harbours.")
            doc.add_paragraph(heading)
            for ref in refs:
                doc.add_paragraph(ref)
        return build

    def coloured(words: list[tuple[str, tuple[int, int, int]]]) -> Any:
        def build(doc: Any) -> None:
            table = doc.add_table(rows=1, cols=len(words))
            for i, (word, rgb) in enumerate(words):
                run = table.cell(0, i).paragraphs[0].add_run(word)
                run.font.color.rgb = RGBColor(*rgb)
        return build

    def pictured(*images: str) -> Any:
        def build(doc: Any) -> None:
            doc.add_paragraph("Figures")
            for image in images:
                doc.add_picture(os.path.join(root, image), width=Inches(1))
        return build

    near_refs = [REFERENCES[0], REFERENCES[1].replace("today", "now"), REFERENCES[2]]
    red, blue, purple = (255, 0, 0), (0, 0, 255), (120, 0, 160)
    files = {"ref/gold.docx": paper(REFERENCES), "ref/near.docx": paper(near_refs),
             "ref/far.docx": paper(["Doe, J. (1999). Something else entirely."] * 3),
             "ref/none.docx": paper(REFERENCES, heading="Sources"),
             "colour/right.docx": coloured([("apple", red), ("boat", blue), ("owl", red)]),
             "colour/wrong.docx": coloured([("apple", blue), ("boat", blue), ("owl", red)]),
             "colour/near.docx": coloured([("apple", (250, 5, 5)), ("boat", purple), ("owl", red)]),
             "pic/gold.docx": pictured("img/base.png"), "pic/other.docx": pictured("img/far.png"),
             "pic/two.docx": pictured("img/base.png", "img/far.png"), "pic/none.docx": pictured()}
    for name, build in files.items():
        _write(root, name, _doc_bytes(build))
    f = "compare_references"
    pairs = [pair(f"{f}/exact", f, "ref/gold.docx", "ref/gold.docx"),
             pair(f"{f}/near", f, "ref/near.docx", "ref/gold.docx"),
             pair(f"{f}/near-base", f, "ref/near.docx", "ref/gold.docx", reference_base_result=0.9),
             pair(f"{f}/far", f, "ref/far.docx", "ref/gold.docx"),
             pair(f"{f}/no-section", f, "ref/none.docx", "ref/gold.docx"),
             pair(f"{f}/malformed", f, "docx/bad.docx", "ref/gold.docx")]
    f = "evaluate_colored_words_in_tables"
    pairs += [pair(f"{f}/exact", f, "colour/right.docx", "colour/right.docx"),
              pair(f"{f}/near", f, "colour/near.docx", "colour/right.docx"),
              pair(f"{f}/near-loose", f, "colour/near.docx", "colour/right.docx", threshold=60),
              pair(f"{f}/far", f, "colour/wrong.docx", "colour/right.docx"),
              pair(f"{f}/malformed", f, "docx/bad.docx", "colour/right.docx")]
    for f in ("compare_docx_images", "compare_contains_image"):
        pairs += [pair(f"{f}/exact", f, "pic/gold.docx", "pic/gold.docx"),
                  pair(f"{f}/other", f, "pic/other.docx", "pic/gold.docx"),
                  pair(f"{f}/two", f, "pic/two.docx", "pic/gold.docx"),
                  pair(f"{f}/none", f, "pic/none.docx", "pic/gold.docx"),
                  pair(f"{f}/malformed", f, "docx/bad.docx", "pic/gold.docx")]
    return pairs


def _docx_format_pairs(root: str) -> list[Pair]:
    files = {"fmt/gold.docx": _formatted_docx(), "fmt/off_center.docx": _formatted_docx(centered=False),
             "fmt/no_sub.docx": _formatted_docx(subscript=False), "fmt/spacing.docx": _formatted_docx(spacing=2.0),
             "fmt/cell.docx": _formatted_docx(cell="3"), "fmt/no_strike.docx": _formatted_docx(strike=False),
             "fmt/italic12.docx": _formatted_docx(italic_pt=12), "fmt/no_break.docx": _formatted_docx(page_break=False),
             "fmt/no_number.docx": _formatted_docx(footer="Draft"), "fmt/sans.docx": _formatted_docx(font="Arial")}
    for name, data in files.items():
        _write(root, name, data)
    pairs: list[Pair] = []
    two = (("compare_docx_tables", "fmt/cell.docx"), ("compare_line_spacing", "fmt/spacing.docx"),
           ("compare_subscript_contains", "fmt/no_sub.docx"), ("compare_docx_lines", "fmt/cell.docx"),
           ("evaluate_strike_through_last_paragraph", "fmt/no_strike.docx"),
           ("check_italic_font_size_14", "fmt/italic12.docx"))
    for func, near in two:
        pairs += [pair(f"{func}/exact", func, "fmt/gold.docx", "fmt/gold.docx"),
                  pair(f"{func}/near", func, near, "fmt/gold.docx"),
                  pair(f"{func}/far", func, "docx/far.docx", "fmt/gold.docx"),
                  pair(f"{func}/malformed", func, "docx/bad.docx", "fmt/gold.docx"),
                  pair(f"{func}/missing", func, None, "fmt/gold.docx")]
    for func, near in (("is_first_line_centered", "fmt/off_center.docx"),
                       ("has_page_numbers_in_footers", "fmt/no_number.docx")):
        pairs += [pair(f"{func}/exact", func, "fmt/gold.docx"), pair(f"{func}/near", func, near),
                  pair(f"{func}/far", func, "docx/far.docx"), pair(f"{func}/malformed", func, "docx/bad.docx")]
    for func, rules, near in (("contains_page_break", {"page_break_count": 1}, "fmt/no_break.docx"),
                              ("compare_font_names", {"font_name": "Liberation Serif"}, "fmt/sans.docx")):
        pairs += [pair(f"{func}/exact", func, "fmt/gold.docx", rules=rules),
                  pair(f"{func}/near", func, near, rules=rules),
                  pair(f"{func}/far", func, "docx/far.docx", rules=rules),
                  pair(f"{func}/malformed", func, "docx/bad.docx", rules=rules)]
    return pairs


def _tabbed_docx(stops: list[tuple[float, str]], lines: tuple[str, ...] = ("Name\tAna Lima", "Role\tEditor")) -> bytes:
    """Paragraphs of tab-separated text, each with the tab stops `stops` (inches, alignment name)."""
    import datetime

    from docx import Document
    from docx.enum.text import WD_TAB_ALIGNMENT
    from docx.shared import Inches

    doc = Document()
    for text in lines:
        fmt = doc.add_paragraph(text).paragraph_format
        for inches, align in stops:
            fmt.tab_stops.add_tab_stop(Inches(inches), getattr(WD_TAB_ALIGNMENT, align))
    when = datetime.datetime(2024, 1, 1)
    doc.core_properties.created = doc.core_properties.modified = when
    out = io.BytesIO()
    doc.save(out)
    return _restamped(out.getvalue())


def _tabstop_pairs(root: str) -> list[Pair]:
    """check_tabstops: the same stops, one moved a little (a fraction), another alignment, another count of
    paragraphs, an unreadable result, and the word count of a tab-separated part."""
    files = {"tab/gold.docx": _tabbed_docx([(2.0, "LEFT"), (5.5, "RIGHT")]),
             "tab/moved.docx": _tabbed_docx([(2.25, "LEFT"), (5.5, "RIGHT")]),
             "tab/aligned.docx": _tabbed_docx([(2.0, "LEFT"), (5.5, "CENTER")]),
             "tab/short.docx": _tabbed_docx([(2.0, "LEFT"), (5.5, "RIGHT")], ("Name\tAna Lima",))}
    for name, data in files.items():
        _write(root, name, data)
    f = "check_tabstops"
    return [pair(f"{f}/exact", f, "tab/gold.docx", "tab/gold.docx"),
            pair(f"{f}/near", f, "tab/moved.docx", "tab/gold.docx"),
            pair(f"{f}/far", f, "tab/aligned.docx", "tab/gold.docx"),
            pair(f"{f}/paragraphs", f, "tab/short.docx", "tab/gold.docx"),
            pair(f"{f}/malformed", f, "docx/bad.docx", "tab/gold.docx"),
            pair(f"{f}/words", f, "tab/gold.docx", "tab/gold.docx", word_number_split_by_tabstop=2, index=1),
            pair(f"{f}/words_off", f, "tab/gold.docx", "tab/gold.docx", word_number_split_by_tabstop=1, index=1)]


def _restamped(data: bytes) -> bytes:
    """An Office file's zip with every member stamped with a fixed time, and its properties' modified time
    fixed (the writers stamp the clock on both: openpyxl whatever the properties say)."""
    import re

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = {name: z.read(name) for name in z.namelist()}
    if "docProps/core.xml" in members:
        members["docProps/core.xml"] = re.sub(rb"(<dcterms:modified[^>]*>)[^<]*", rb"\g<1>2024-01-01T00:00:00Z",
                                              members["docProps/core.xml"])
    return _zip(members)


def _xlsx(sheets: dict[str, list[list[Any]]]) -> bytes:
    import datetime

    import openpyxl

    wb = openpyxl.Workbook()
    wb.remove(wb.active)
    for title, rows in sheets.items():
        ws = wb.create_sheet(title)
        for row in rows:
            ws.append(row)
    wb.properties.created = wb.properties.modified = datetime.datetime(2024, 1, 1)
    out = io.BytesIO()
    wb.save(out)
    return _restamped(out.getvalue())


SALES = [["Region", "Q1", "Q2"], ["North", 120, 135.5], ["South", 98, 101.25], ["East", 77, 80]]


def _table_pairs(root: str) -> list[Pair]:
    near = [list(r) for r in SALES]
    near[2][2] = 101.2
    _write(root, "xlsx/gold.xlsx", _xlsx({"Sheet1": SALES, "Notes": [["checked"]]}))
    _write(root, "xlsx/near.xlsx", _xlsx({"Sheet1": near, "Notes": [["checked"]]}))
    _write(root, "xlsx/renamed.xlsx", _xlsx({"Data": SALES, "Notes": [["checked"]]}))
    _write(root, "xlsx/far.xlsx", _xlsx({"Sheet1": [["x"], [1]]}))
    _write(root, "xlsx/bad.xlsx", b"PK\x03\x04 not a workbook")
    data = [{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]
    names = [{"type": "sheet_name"}]
    both = data + names + [{"type": "sheet_data", "sheet_idx0": "RNNotes", "sheet_idx1": "ENNotes"}]
    f = "compare_table"
    return [pair(f"{f}/exact", f, "xlsx/gold.xlsx", "xlsx/gold.xlsx", options={"rules": both}),
            pair(f"{f}/near", f, "xlsx/near.xlsx", "xlsx/gold.xlsx", options={"rules": data}),
            pair(f"{f}/renamed-data", f, "xlsx/renamed.xlsx", "xlsx/gold.xlsx", options={"rules": data}),
            pair(f"{f}/renamed-names", f, "xlsx/renamed.xlsx", "xlsx/gold.xlsx", options={"rules": names}),
            pair(f"{f}/far", f, "xlsx/far.xlsx", "xlsx/gold.xlsx", options={"rules": both}),
            pair(f"{f}/malformed", f, "xlsx/bad.xlsx", "xlsx/gold.xlsx", options={"rules": data}),
            pair(f"{f}/missing", f, None, "xlsx/gold.xlsx", options={"rules": data}),
            *_table_rule_pairs()]


def _table_rule_pairs() -> list[Pair]:
    """compare_table's cell-wise rules: sheet_fuzzy and check_cell."""
    f = "compare_table"

    def fuzzy(*rules: dict[str, Any]) -> dict[str, Any]:
        return {"rules": [{"type": "sheet_fuzzy", "sheet_idx0": "RI0", "sheet_idx1": "EI0", "rules": list(rules)}]}

    def cell(coordinate: str, **props: Any) -> dict[str, Any]:
        return {"rules": [{"type": "check_cell", "sheet_idx": 0, "coordinate": coordinate, "props": props}]}
    return [pair(f"{f}/fuzzy-exact", f, "xlsx/near.xlsx", "xlsx/gold.xlsx",
                 options=fuzzy({"range": ["A1:A4"], "type": "exact_match"})),
            pair(f"{f}/fuzzy-case", f, "xlsx/near.xlsx", "xlsx/gold.xlsx",
                 options=fuzzy({"range": ["A2:B2"], "type": "exact_match", "ignore_case": True})),
            pair(f"{f}/fuzzy-far", f, "xlsx/far.xlsx", "xlsx/gold.xlsx",
                 options=fuzzy({"range": ["A1:A2"], "type": "exact_match"})),
            pair(f"{f}/fuzzy-includes", f, "xlsx/gold.xlsx", "xlsx/renamed.xlsx",
                 options=fuzzy({"range": ["A2"], "type": "includes"})),
            pair(f"{f}/fuzzy-malformed", f, "xlsx/bad.xlsx", "xlsx/gold.xlsx",
                 options=fuzzy({"range": ["A1"], "type": "exact_match"})),
            pair(f"{f}/cell-approx", f, "xlsx/near.xlsx", None, options=cell("C3", value={"method": "approx:0.1",
                                                                                        "ref": 101.25})),
            pair(f"{f}/cell-tight", f, "xlsx/near.xlsx", None, options=cell("C3", value={"method": "approx:0.01",
                                                                                       "ref": 101.25})),
            pair(f"{f}/cell-text", f, "xlsx/gold.xlsx", None, options=cell("A2", value={"method": "eq",
                                                                                      "ref": "North"})),
            pair(f"{f}/cell-re", f, "xlsx/gold.xlsx", None, options=cell("A3", value={"method": "re.I",
                                                                                    "ref": "^south$"})),
            pair(f"{f}/cell-malformed", f, "xlsx/bad.xlsx", None, options=cell("A2", value={"method": "eq",
                                                                                          "ref": "North"}))]


def _props_xlsx(*, freeze: str = "B2", zoom: int = 150, height: float = 30, width: float = 20, pick: str = "North",
                title: str = "Sales", bold: bool = True, validation: str = '"Yes,No"') -> bytes:
    """SALES with a sheet's properties set as Calc saves them: frozen panes, zoom, a list validation, a row's
    height, columns' widths (one hidden), an autofilter with a picked value, a bar chart, a bold filled cell."""
    import datetime

    import openpyxl
    from openpyxl.chart import BarChart, Reference
    from openpyxl.styles import Font, PatternFill
    from openpyxl.worksheet.datavalidation import DataValidation

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sheet1"
    for row in SALES:
        ws.append(row)
    ws.freeze_panes = freeze
    ws.sheet_view.zoomScale = zoom
    dv = DataValidation(type="list", formula1=validation, allow_blank=True)
    dv.add("D2:D4")
    ws.add_data_validation(dv)
    ws.row_dimensions[1].height = height
    ws.column_dimensions["A"].width = width
    ws.column_dimensions["C"].hidden = True
    ws.auto_filter.ref = "A1:C4"
    ws.auto_filter.add_filter_column(0, [pick])
    chart = BarChart()
    chart.title = title
    chart.add_data(Reference(ws, min_col=2, min_row=1, max_col=3, max_row=4), titles_from_data=True)
    chart.set_categories(Reference(ws, min_col=1, min_row=2, max_row=4))
    ws.add_chart(chart, "E2")
    ws["A1"].font = Font(bold=bold)
    ws["A1"].fill = PatternFill("solid", fgColor="FFFF00")
    wb.properties.created = wb.properties.modified = datetime.datetime(2024, 1, 1)
    out = io.BytesIO()
    wb.save(out)
    return _restamped(out.getvalue())


def _sheet_print_pairs(root: str) -> list[Pair]:
    """sheet_print: each workbook's sheet as Calc prints it to `<book>-<sheet>.csv` beside it (the task's
    postconfig exports it)."""
    printed = "Region,Q1,Q2\nNorth,120,135.5\nZürich,98,101.25\n\n"
    _write(root, "print/gold.xlsx", _xlsx({"Sheet1": SALES}))
    _write(root, "print/gold-Sheet1.csv", printed)
    for name, text in (("exact", printed.replace("\n", "\r\n") + "\n"), ("near", printed.replace("135.5", "135.4")),
                       ("case", printed.upper()), ("latin1", printed.encode("latin-1")), ("far", "x\n1\n")):
        _write(root, f"print/{name}.xlsx", _xlsx({"Sheet1": SALES}))
        _write(root, f"print/{name}-Sheet1.csv", text)
    _write(root, "print/unprinted.xlsx", _xlsx({"Sheet1": SALES}))
    f = "compare_table"
    rule = {"rules": [{"type": "sheet_print", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"}]}
    caseless = {"rules": [{**rule["rules"][0], "ignore_case": True}]}
    return [pair(f"{f}/print-exact", f, "print/exact.xlsx", "print/gold.xlsx", options=rule),
            pair(f"{f}/print-near", f, "print/near.xlsx", "print/gold.xlsx", options=rule),
            pair(f"{f}/print-case", f, "print/case.xlsx", "print/gold.xlsx", options=rule),
            pair(f"{f}/print-ignore-case", f, "print/case.xlsx", "print/gold.xlsx", options=caseless),
            pair(f"{f}/print-latin1", f, "print/latin1.xlsx", "print/gold.xlsx", options=rule),
            pair(f"{f}/print-far", f, "print/far.xlsx", "print/gold.xlsx", options=rule),
            pair(f"{f}/print-unprinted", f, "print/unprinted.xlsx", "print/gold.xlsx", options=rule),
            pair(f"{f}/print-malformed", f, "xlsx/bad.xlsx", "print/gold.xlsx", options=rule)]


def _sparkline_xlsx(lines: dict[str, str]) -> bytes:
    """SALES with a sparkline group (x14, as Calc and Excel save one) drawing each of `lines`: cell -> range."""
    import re

    with zipfile.ZipFile(io.BytesIO(_xlsx({"Sheet1": SALES}))) as z:
        members = {name: z.read(name) for name in z.namelist()}
    each = "".join(f"<x14:sparkline><xm:f>{source}</xm:f><xm:sqref>{cell}</xm:sqref></x14:sparkline>"
                   for cell, source in lines.items())
    ext = ('<extLst><ext uri="{05C60535-1F16-4fd2-B633-F4F36F0B64E0}" '
           'xmlns:x14="http://schemas.microsoft.com/office/spreadsheetml/2009/9/main"><x14:sparklineGroups '
           'xmlns:xm="http://schemas.microsoft.com/office/excel/2006/main">'
           '<x14:sparklineGroup displayEmptyCellsAs="gap">'
           f'<x14:colorSeries rgb="FF376092"/><x14:sparklines>{each}</x14:sparklines></x14:sparklineGroup>'
           '</x14:sparklineGroups></ext></extLst>')
    members["xl/worksheets/sheet1.xml"] = re.sub(rb"</worksheet>", ext.encode() + b"</worksheet>",
                                                 members["xl/worksheets/sheet1.xml"], count=1)
    return _zip(members)


def _sparkline_pairs(root: str) -> list[Pair]:
    lines = {"D2": "Sheet1!B2:C2", "D3": "Sheet1!B3:C3", "D4": "Sheet1!B4:C4"}
    _write(root, "xlsx/spark.xlsx", _sparkline_xlsx(lines))
    _write(root, "xlsx/spark-near.xlsx", _sparkline_xlsx({**lines, "D4": "Sheet1!B4:B4"}))
    _write(root, "xlsx/spark-fewer.xlsx", _sparkline_xlsx({"D2": lines["D2"]}))
    f = "compare_table"
    rule = {"rules": [{"type": "sparkline", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"}]}
    return [pair(f"{f}/sparkline-exact", f, "xlsx/spark.xlsx", "xlsx/spark.xlsx", options=rule),
            pair(f"{f}/sparkline-near", f, "xlsx/spark-near.xlsx", "xlsx/spark.xlsx", options=rule),
            pair(f"{f}/sparkline-fewer", f, "xlsx/spark-fewer.xlsx", "xlsx/spark.xlsx", options=rule),
            pair(f"{f}/sparkline-far", f, "xlsx/gold.xlsx", "xlsx/spark.xlsx", options=rule),
            pair(f"{f}/sparkline-malformed", f, "xlsx/bad.xlsx", "xlsx/spark.xlsx", options=rule)]


def _pivot_xlsx(*, data: int = 1, subtotal: str = "sum", rows: int = 0, hidden: tuple[int, ...] = ()) -> bytes:
    """SALES with a pivot table beside it (openpyxl writes the definition and its cache as given): rows by
    field `rows`, the `subtotal` of field `data`, the row field's items in `hidden` filtered out."""
    import datetime

    import openpyxl
    from openpyxl.pivot.cache import CacheDefinition, CacheField, CacheSource, SharedItems, WorksheetSource
    from openpyxl.pivot.record import RecordList
    from openpyxl.pivot.table import DataField, FieldItem, Location, PivotField, RowColField, TableDefinition

    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Sheet1"
    for row in SALES:
        ws.append(row)
    cache = CacheDefinition(
        cacheSource=CacheSource(type="worksheet", worksheetSource=WorksheetSource(ref="A1:C4", sheet="Sheet1")),
        cacheFields=[CacheField(name=name, sharedItems=SharedItems()) for name in SALES[0]])
    cache.records = RecordList()
    fields = []
    for i in range(3):
        if i == rows:
            items = [FieldItem(x=x, h=True if x in hidden else None) for x in range(3)] + [FieldItem(t="default")]
            fields.append(PivotField(axis="axisRow", showAll=False, items=items))
        else:
            fields.append(PivotField(dataField=i == data, showAll=False))
    table = TableDefinition(name="DataPilot1", cacheId=1, dataCaption="Data",
                            location=Location(ref="E1:F5", firstHeaderRow=1, firstDataRow=1, firstDataCol=1),
                            pivotFields=fields, rowFields=[RowColField(x=rows)],
                            dataFields=[DataField(name=f"{subtotal} - {SALES[0][data]}", fld=data, subtotal=subtotal)])
    table.cache = cache
    ws._pivots.append(table)
    wb.properties.created = wb.properties.modified = datetime.datetime(2024, 1, 1)
    out = io.BytesIO()
    wb.save(out)
    return _restamped(out.getvalue())


def _pivot_pairs(root: str) -> list[Pair]:
    _write(root, "xlsx/pivot.xlsx", _pivot_xlsx())
    _write(root, "xlsx/pivot-q2.xlsx", _pivot_xlsx(data=2))
    _write(root, "xlsx/pivot-average.xlsx", _pivot_xlsx(subtotal="average"))
    _write(root, "xlsx/pivot-filtered.xlsx", _pivot_xlsx(hidden=(1,)))
    f = "compare_table"
    rule = {"rules": [{"type": "pivot_table", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1",
                       "pivot_props": ["col_fields", "filter", "row_fields", "data_fields"]}]}
    return [pair(f"{f}/pivot-exact", f, "xlsx/pivot.xlsx", "xlsx/pivot.xlsx", options=rule),
            pair(f"{f}/pivot-other-field", f, "xlsx/pivot-q2.xlsx", "xlsx/pivot.xlsx", options=rule),
            pair(f"{f}/pivot-average", f, "xlsx/pivot-average.xlsx", "xlsx/pivot.xlsx", options=rule),
            pair(f"{f}/pivot-filtered", f, "xlsx/pivot-filtered.xlsx", "xlsx/pivot.xlsx", options=rule),
            pair(f"{f}/pivot-far", f, "xlsx/gold.xlsx", "xlsx/pivot.xlsx", options=rule),
            pair(f"{f}/pivot-malformed", f, "xlsx/bad.xlsx", "xlsx/pivot.xlsx", options=rule)]


def _table_props_pairs(root: str) -> list[Pair]:
    """compare_table's rules on a sheet's properties: freeze, zoom, data_validation, row_props, col_props,
    filter, chart, style (each against the workbook with all of them set, one set otherwise, none, and a
    file that is no workbook)."""
    _write(root, "xlsx/props.xlsx", _props_xlsx())
    near = {"freeze": dict(freeze="B3"), "zoom": dict(zoom=140), "row_props": dict(height=28),
            "col_props": dict(width=18), "filter": dict(pick="South"), "chart": dict(title="Sale"),
            "style": dict(bold=False), "data_validation": dict(validation='"Yes,No,Maybe"')}
    for kind, change in near.items():
        _write(root, f"xlsx/props-{kind}.xlsx", _props_xlsx(**change))  # type: ignore[arg-type]
    both = {"sheet_idx0": "RI0", "sheet_idx1": "EI0"}
    rules = {"freeze": both, "row_props": {**both, "props": ["height", "hidden"]},
             "col_props": {**both, "props": ["width", "hidden"]}, "filter": both,
             "chart": {**both, "chart_props": ["type", "title", "direction"]},
             "style": {**both, "props": ["font_bold", "font_size", "fill_type", "bgcolor"]},
             "zoom": {"sheet_idx": 0, "method": "ge", "ref": 150},
             "data_validation": {"sheet_idx": 0, "dv_props": [{"type": {"method": "eq", "ref": "list"},
                                                               "formula1": {"method": "eq", "ref": '"Yes,No"'}}]}}
    f = "compare_table"
    pairs = _sheet_print_pairs(root) + _sparkline_pairs(root) + _pivot_pairs(root)
    for kind, r in rules.items():
        given = {"rules": [{"type": kind, **r}]}
        pairs += [pair(f"{f}/{kind}-exact", f, "xlsx/props.xlsx", "xlsx/props.xlsx", options=given),
                  pair(f"{f}/{kind}-near", f, f"xlsx/props-{kind}.xlsx", "xlsx/props.xlsx", options=given),
                  pair(f"{f}/{kind}-far", f, "xlsx/gold.xlsx", "xlsx/props.xlsx", options=given),
                  pair(f"{f}/{kind}-malformed", f, "xlsx/bad.xlsx", "xlsx/props.xlsx", options=given)]
    return pairs


def _pptx(slides: list[tuple[str, str]]) -> bytes:
    import datetime

    from pptx import Presentation

    deck = Presentation()
    for title, body in slides:
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = title
        slide.placeholders[1].text = body
    deck.core_properties.created = deck.core_properties.modified = datetime.datetime(2024, 1, 1)
    deck.core_properties.last_modified_by = "gh"
    deck.core_properties.revision = 1
    out = io.BytesIO()
    deck.save(out)
    return _restamped(out.getvalue())


def _deck_with(fills: list[tuple[int, int, int] | None], *, portrait: bool = False,
               transition: str | None = None) -> bytes:
    """A deck of one slide per fill (an RGB background, or None: the master's), portrait or not, the
    first slide with a transition of that kind."""
    import datetime
    import re

    from pptx import Presentation
    from pptx.dml.color import RGBColor
    from pptx.util import Inches

    deck = Presentation()
    if portrait:
        deck.slide_width, deck.slide_height = Inches(7.5), Inches(10)
    for rgb in fills:
        slide = deck.slides.add_slide(deck.slide_layouts[6])
        if rgb is not None:
            slide.background.fill.solid()
            slide.background.fill.fore_color.rgb = RGBColor(*rgb)
    deck.core_properties.created = deck.core_properties.modified = datetime.datetime(2024, 1, 1)
    out = io.BytesIO()
    deck.save(out)
    data = _restamped(out.getvalue())
    if transition is None:
        return data
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = {name: z.read(name) for name in z.namelist()}
    xml = members["ppt/slides/slide1.xml"]
    members["ppt/slides/slide1.xml"] = re.sub(rb"(</p:clrMapOvr>)", rb"\1<p:transition><p:" + transition.encode()
                                              + rb"/></p:transition>", xml, count=1)
    return _zip(members)


def _slide_metric_pairs(root: str) -> list[Pair]:
    files = {"pptx/blue.pptx": _deck_with([(0, 0, 255), (0, 0, 255)]),
             "pptx/bluish.pptx": _deck_with([(20, 30, 230), (0, 0, 255)]),
             "pptx/red.pptx": _deck_with([(255, 0, 0), None]),
             "pptx/portrait.pptx": _deck_with([None], portrait=True),
             "pptx/dissolve.pptx": _deck_with([None, None], transition="dissolve"),
             "pptx/fade.pptx": _deck_with([None, None], transition="fade")}
    for name, data in files.items():
        _write(root, name, data)
    f = "evaluate_presentation_fill_to_rgb_distance"
    blue = {"rgb": [0, 0, 255]}
    pairs = [pair(f"{f}/exact", f, "pptx/blue.pptx", rules=blue),
             pair(f"{f}/near", f, "pptx/bluish.pptx", rules=blue),
             pair(f"{f}/far", f, "pptx/red.pptx", rules=blue),
             pair(f"{f}/unchanged-original", f, "pptx/red.pptx", rules={**blue, "original_rgb": [255, 0, 0]}),
             pair(f"{f}/malformed", f, "pptx/bad.pptx", rules=blue)]
    f = "check_slide_orientation_Portrait"
    pairs += [pair(f"{f}/exact", f, "pptx/portrait.pptx"), pair(f"{f}/far", f, "pptx/gold.pptx"),
              pair(f"{f}/square-ish", f, "pptx/blue.pptx"), pair(f"{f}/malformed", f, "pptx/bad.pptx")]
    f = "check_transition"
    dissolve = {"slide_idx": 0, "transition_type": "dissolve"}
    pairs += [pair(f"{f}/exact", f, "pptx/dissolve.pptx", rules=dissolve),
              pair(f"{f}/near", f, "pptx/fade.pptx", rules=dissolve),
              pair(f"{f}/far", f, "pptx/gold.pptx", rules=dissolve),
              pair(f"{f}/no-slide", f, "pptx/dissolve.pptx", rules={**dissolve, "slide_idx": 5}),
              pair(f"{f}/malformed", f, "pptx/bad.pptx", rules=dissolve)]
    return pairs


def _slide_pairs(root: str) -> list[Pair]:
    deck = [("Quarterly review", "Sales rose in the north"), ("Next steps", "Hire two engineers")]
    _write(root, "pptx/gold.pptx", _pptx(deck))
    _write(root, "pptx/near.pptx", _pptx([deck[0], ("Next steps", "Hire three engineers")]))
    _write(root, "pptx/short.pptx", _pptx(deck[:1]))
    _write(root, "pptx/far.pptx", _pptx([("Agenda", "Welcome")]))
    _write(root, "pptx/bad.pptx", b"PK\x03\x04 not a deck")
    f = "compare_pptx_files"
    return [pair(f"{f}/exact", f, "pptx/gold.pptx", "pptx/gold.pptx"),
            pair(f"{f}/near", f, "pptx/near.pptx", "pptx/gold.pptx"),
            pair(f"{f}/short", f, "pptx/short.pptx", "pptx/gold.pptx"),
            pair(f"{f}/short-unexamined", f, "pptx/short.pptx", "pptx/gold.pptx", examine_number_of_slides=False),
            pair(f"{f}/far", f, "pptx/far.pptx", "pptx/gold.pptx"),
            pair(f"{f}/malformed", f, "pptx/bad.pptx", "pptx/gold.pptx")]


# -- VLC, Thunderbird, the accessibility tree: files and texts as their getters give them --

def _vlcrc(**values: str) -> str:
    """A vlcrc as VLC writes it: every option a comment with its default until it is set (then uncommented)."""
    defaults = {"qt-bgcone": "1", "qt-max-volume": "125", "qt-minimal-view": "0",
                "qt-slider-colours": "153;210;153;20;210;20;255;199;15;245;39;29", "global-key-play-pause": "",
                "one-instance-when-started-from-file": "1", "input-record-path": ""}
    lines = ["###", "###  vlc 3.0.18", "###", "", "[qt] # Qt interface", ""]
    for name, default in defaults.items():
        lines += [f"# {name.replace('-', ' ')} (string)",
                  f"{name}={values[name]}" if name in values else f"#{name}={default}", ""]
    return "\n".join(lines) + "\n"


def _vlc_status(state: str, **meta: str) -> str:
    """VLC's HTTP status.xml: its state and the playing item's meta data."""
    infos = "".join(f"<info name='{k}'>{v}</info>" for k, v in meta.items())
    return (f"<?xml version=\"1.0\" encoding=\"utf-8\" standalone=\"yes\" ?>\n<root><fullscreen>false</fullscreen>"
            f"<volume>256</volume><state>{state}</state><information><category name=\"meta\">{infos}</category>"
            f"</information></root>\n")


def _vlc_pairs(root: str) -> list[Pair]:
    _write(root, "vlc/default.vlcrc", _vlcrc())
    _write(root, "vlc/set.vlcrc", _vlcrc(**{
        "qt-bgcone": "0", "qt-max-volume": "200", "qt-minimal-view": "1", "qt-slider-colours":
        "10;20;30;40;50;60;70;80;90;0;0;0",
        "global-key-play-pause": "Ctrl+Space",
        "one-instance-when-started-from-file": "0", "input-record-path": "/home/user/Desktop"}))
    _write(root, "vlc/bad.vlcrc", b"\xff\xfe[qt]\x00\x81 not text")
    pairs: list[Pair] = []
    for f, key, set_to, default, near in (
            ("check_qt_bgcone", "expected_qt_bgcone", "0", "1", None),
            ("check_qt_max_volume", "expected_qt_max_volume", "200", "125", "150"),
            ("check_qt_minimal_view", "expected_qt_minimal_view", "1", "0", None),
            ("check_global_key_play_pause", "expected_global_key_play_pause", "1", "0", None),
            ("check_one_instance_when_started_from_file", "expected_one_instance_when_started_from_file", "0",
             "1", None)):
        pairs += [pair(f"{f}/exact", f, "vlc/set.vlcrc", rules={key: set_to}),
                  pair(f"{f}/untouched", f, "vlc/default.vlcrc", rules={key: set_to}),
                  pair(f"{f}/default", f, "vlc/default.vlcrc", rules={key: default}),
                  pair(f"{f}/number", f, "vlc/set.vlcrc", rules={key: int(set_to)}),
                  pair(f"{f}/malformed", f, "vlc/bad.vlcrc", rules={key: set_to})]
        if near is not None:
            pairs.append(pair(f"{f}/near", f, "vlc/set.vlcrc", rules={key: near}))
    f = "check_qt_slider_colours"
    dark = "10;20;30;40;50;60;70;80;90;0;0;0"
    pairs += [pair(f"{f}/exact", f, "vlc/set.vlcrc", rules={"type": "match", "expected_qt_slider_colours": dark}),
              pair(f"{f}/near", f, "vlc/set.vlcrc", rules={"type": "match",
                                                             "expected_qt_slider_colours": dark.replace("90", "91")}),
              pair(f"{f}/blackish", f, "vlc/set.vlcrc", rules={"type": "blackish"}),
              pair(f"{f}/untouched-blackish", f, "vlc/default.vlcrc", rules={"type": "blackish"}),
              pair(f"{f}/malformed", f, "vlc/bad.vlcrc", rules={"type": "blackish"})]
    f = "is_vlc_recordings_folder"
    pairs += [pair(f"{f}/exact", f, "vlc/set.vlcrc", rules={"recording_file_path": "/home/user/Desktop"}),
              pair(f"{f}/near", f, "vlc/set.vlcrc", rules={"recording_file_path": "/home/user/Desktop/"}),
              pair(f"{f}/untouched", f, "vlc/default.vlcrc", rules={"recording_file_path": "/home/user/Desktop"}),
              pair(f"{f}/malformed", f, "vlc/bad.vlcrc", rules={"recording_file_path": "/home/user/Desktop"})]
    stream = "https://media.example.org/live/news/stream.m3u8"
    _write(root, "vlc/playing.xml", _vlc_status("playing", filename="Rick Astley.mp4"))
    _write(root, "vlc/paused.xml", _vlc_status("paused", filename="Rick Astley.mp4"))
    _write(root, "vlc/other.xml", _vlc_status("playing", filename="Never Gonna.mp4"))
    _write(root, "vlc/titled.xml", _vlc_status("playing", title="Rick Astley.mp4"))
    _write(root, "vlc/stream.xml", _vlc_status("playing", url=stream))
    _write(root, "vlc/stream-name.xml", _vlc_status("playing", filename="stream.m3u8"))
    _write(root, "vlc/stream-longer.xml", _vlc_status("playing", url="https://media.example.org/live/news/stream.m3u8?t=1"))
    _write(root, "vlc/stream-other.xml", _vlc_status("playing", url="https://other.example.org/stream.m3u8"))
    _write(root, "vlc/bad.xml", "<root><state>playing</state>")
    f = "is_vlc_fullscreen"
    screen = {"width": 1920, "height": 1080}
    pairs += [pair(f"{f}/exact", f, None, rules=screen, value={"width": 1920, "height": 1080}),
              pair(f"{f}/near", f, None, rules=screen, value={"width": 1920, "height": 1053}),
              pair(f"{f}/far", f, None, rules=screen, value={"width": 800, "height": 600}),
              pair(f"{f}/none", f, None, rules=screen, value={})]
    f = "is_vlc_playing"
    name = {"type": "file_name", "file_name": "Rick Astley.mp4"}
    url = {"type": "url", "url": stream}
    pairs += [pair(f"{f}/exact", f, "vlc/playing.xml", rules=name, read=True),
              pair(f"{f}/paused", f, "vlc/paused.xml", rules=name, read=True),
              pair(f"{f}/far", f, "vlc/other.xml", rules=name, read=True),
              pair(f"{f}/title", f, "vlc/titled.xml", rules=name, read=True),
              pair(f"{f}/url", f, "vlc/stream.xml", rules=url, read=True),
              pair(f"{f}/url-file-name", f, "vlc/stream-name.xml", rules=url, read=True),
              pair(f"{f}/url-longer", f, "vlc/stream-longer.xml", rules=url, read=True),
              pair(f"{f}/url-far", f, "vlc/stream-other.xml", rules=url, read=True),
              pair(f"{f}/malformed", f, "vlc/bad.xml", rules=name, read=True)]
    return pairs


def _thunderbird_pairs(root: str) -> list[Pair]:
    prefs = ['// Mozilla User Preferences', '', 'user_pref("mail.spellcheck.inline", false);',
             'user_pref("mailnews.default_sort_order", 2);',
             'user_pref("mail.identity.id1.fullName", "Ana \\"A\\" Lima");',
             'user_pref("browser.cache.disk.capacity", 1048576);']
    _write(root, "tb/prefs.js", "\n".join(prefs) + "\n")
    _write(root, "tb/near-prefs.js", "\n".join([*prefs[:-1], 'user_pref("mailnews.default_sort_order", 1);']) + "\n")
    _write(root, "tb/empty-prefs.js", "// Mozilla User Preferences\n")
    _write(root, "tb/bad-prefs.js", b"\xff\xfeuser_pref(\x81")
    f = "check_thunderbird_prefs"
    want = {"expect": {"mail.spellcheck.inline": {"method": "eq", "ref": False},
                       "mailnews.default_sort_order": {"method": "eq", "ref": 2}},
            "unexpect": {"browser.cache.disk.capacity": {"method": "eq", "ref": 0}}}
    pairs = [pair(f"{f}/exact", f, "tb/prefs.js", rules=want),
             pair(f"{f}/near", f, "tb/near-prefs.js", rules=want),
             pair(f"{f}/far", f, "tb/empty-prefs.js", rules=want),
             pair(f"{f}/quoted", f, "tb/prefs.js", rules={"expect": {"mail.identity.id1.fullName": {
                 "method": "eq", "ref": 'Ana "A" Lima'}}}),
             pair(f"{f}/unexpected", f, "tb/prefs.js", rules={"unexpect": {"mail.spellcheck.inline": {
                 "method": "eq", "ref": False}}}),
             pair(f"{f}/malformed", f, "tb/bad-prefs.js", rules=want)]

    def rules_file(*filters: tuple[str, str, str, str]) -> str:
        lines = ['version="9"', 'logging="no"']
        for name, enabled, value, condition in filters:
            lines += [f'name="{name}"', f'enabled="{enabled}"', 'type="17"', 'action="Move to folder"',
                      f'actionValue="{value}"', f'condition="{condition}"']
        return "\n".join(lines) + "\n"

    spam = ("Discounts", "yes", "mailbox://nobody@Local%20Folders/Promotions", 'AND (subject,contains,discount)')
    boss = ("Boss", "yes", "mailbox://nobody@Local%20Folders/Work",
            'OR (from,contains,boss@example.org) OR (subject,is,\\"urgent\\")')
    _write(root, "tb/msgFilterRules.dat", rules_file(spam, boss))
    _write(root, "tb/near-filters.dat", rules_file((spam[0], "no", *spam[2:])))
    _write(root, "tb/no-filters.dat", 'version="9"\nlogging="no"\n')
    _write(root, "tb/bad-filters.dat", b"\xff\xfename=\x81")
    f = "check_thunderbird_filter"
    want_f = {"expect": [{"name": "Discounts", "enabled": "yes", "action": "Move to folder",
                          "actionValue": "mailbox://nobody@Local%20Folders/Promotions",
                          "condition": ["AND (subject,contains,discount)"]}]}
    pairs += [pair(f"{f}/exact", f, "tb/msgFilterRules.dat", rules=want_f),
              pair(f"{f}/near", f, "tb/near-filters.dat", rules=want_f),
              pair(f"{f}/far", f, "tb/no-filters.dat", rules=want_f),
              pair(f"{f}/quoted-condition", f, "tb/msgFilterRules.dat", rules={"expect": [{
                  "name": "Boss", "condition": ["OR (from,contains,boss@example.org)", 'OR (subject,is,"urgent")']}]}),
              pair(f"{f}/unexpected", f, "tb/msgFilterRules.dat", rules={"unexpect": [{"name": "Boss"}]}),
              pair(f"{f}/malformed", f, "tb/bad-filters.dat", rules=want_f)]
    return pairs


def _a11y_tree(address: str) -> str:
    """An accessibility tree as gh_osworld/a11y.py writes it (OSWorld's namespaces): Chromium with an address bar."""
    base = "https://accessibility.ubuntu.example.org/ns/"
    ns = " ".join(f'xmlns:{k}="{base}{v}"' for k, v in (("st", "state"), ("attr", "attributes"), ("cp", "component")))
    return (f'<desktop-frame {ns} name="main"><application name="Chromium"><frame name="Settings - Chromium" '
            f'st:showing="true"><entry name="Address and search bar" st:focused="true">{address}</entry>'
            f'<push-button name="Reload" cp:screencoord="(87, 84)"/><label name="Font size">Medium</label>'
            f'</frame></application></desktop-frame>')


def _a11y_pairs(root: str) -> list[Pair]:
    f = "check_accessibility_tree"
    tree = _a11y_tree("chrome://settings/fonts")
    bar = ["application[name=Chromium] entry[name=\"Address and search bar\"]"]

    def rule(**r: Any) -> list[dict[str, Any]]:
        return [r]
    return [pair(f"{f}/exact", f, None, text=tree, rules=rule(selectors=bar, text="chrome://settings/fonts",
                                                              exact=True)),
            pair(f"{f}/near-exact", f, None, text=tree, rules=rule(selectors=bar, text="chrome://settings/font",
                                                                   exact=True)),
            pair(f"{f}/near-fuzzy", f, None, text=tree, rules=rule(selectors=bar, text="chrome://settings/font",
                                                                   exact=False)),
            pair(f"{f}/fuzzy-two", f, None, text=tree,
                 rules=[{"selectors": bar, "text": "chrome://settings/appearance", "exact": False},
                        {"xpath": "//label[@name='Font size']", "text": "Large", "exact": False}]),
            pair(f"{f}/xpath", f, None, text=tree, rules=rule(xpath="//push-button[@name='Reload']")),
            # Namespaced: the states and the component's place, as OSWorld's tasks select them.
            pair(f"{f}/xpath-state", f, None, text=tree,
                 rules=rule(xpath="//frame[@st:showing='true']//entry[@st:focused='true']",
                            text="chrome://settings/fonts", exact=True)),
            pair(f"{f}/xpath-component", f, None, text=tree, rules=rule(xpath="//*[@cp:screencoord='(87, 84)']")),
            pair(f"{f}/xpath-state-absent", f, None, text=tree, rules=rule(xpath="//label[@st:focused='true']")),
            pair(f"{f}/far", f, None, text=tree, rules=rule(selectors=["application[name=Firefox] entry"])),
            pair(f"{f}/empty-text", f, None, text=tree, rules=rule(xpath="//push-button", text="Reload", exact=False)),
            pair(f"{f}/malformed", f, None, text="<desktop-frame><application", rules=rule(xpath="//entry"))]


def _chrome_pairs(root: str) -> list[Pair]:
    """Chrome's metrics on what its getters give (the front tab, the tabs, bookmarks, history rows, cookie
    rows, flags, font sizes, extensions, desktop shortcuts), as values: no browser runs here."""
    docs = "https://docs.example.org/guide/"
    tab = {"title": "Guide", "url": "https://www.docs.example.org/guide/"}
    pairs: list[Pair] = []
    f = "is_expected_active_tab"
    want = {"type": "url", "url": docs}
    pairs += [pair(f"{f}/exact", f, None, rules=want, value={"title": "Guide", "url": docs}),
              pair(f"{f}/www", f, None, rules=want, value=tab),
              pair(f"{f}/near", f, None, rules=want, value={"title": "Guide", "url": docs + "install"}),
              pair(f"{f}/scheme", f, None, rules={"type": "url", "url": "http://docs.example.org/guide"},
                   value={"title": "Guide", "url": "docs.example.org/guide"}),
              pair(f"{f}/text", f, None, rules=want, value=docs.upper().replace("HTTPS", "https")),
              pair(f"{f}/suffix", f, None, rules=want,
                   value={"title": "Guide", "url": "https://docs.example.com.sg/guide/"}),
              pair(f"{f}/port", f, None, rules=want,
                   value={"title": "Guide", "url": "https://docs.example.org:8443/guide/"}),
              pair(f"{f}/far", f, None, rules=want, value={"title": "News", "url": "https://news.example.org/"}),
              pair(f"{f}/none", f, None, rules=want, value={})]
    f = "is_expected_url_pattern_match"
    pattern = {"expected": [r"docs\.example\.org", r"/guide/?$"]}
    pairs += [pair(f"{f}/exact", f, None, rules=pattern, value=tab),
              pair(f"{f}/text", f, None, rules=pattern, value=docs),
              pair(f"{f}/near", f, None, rules=pattern, value={"url": docs + "install"}),
              pair(f"{f}/far", f, None, rules=pattern, value={"url": "https://news.example.org/"}),
              pair(f"{f}/none", f, None, rules=pattern, value={"title": "no url"})]
    f = "is_expected_search_query"
    query = {"expect": {"pattern": r"q=dogs(&|$)"}}
    pairs += [pair(f"{f}/exact", f, None, rules=query, value={"url": "https://search.example.org/search?q=dogs"}),
              pair(f"{f}/near", f, None, rules=query, value={"url": "https://search.example.org/search?q=dogsled"}),
              pair(f"{f}/far", f, None, rules=query, value=tab),
              pair(f"{f}/none", f, None, rules=query, value={})]
    f = "is_expected_tabs"
    tabs = {"type": "url", "urls": [docs, "https://news.example.org/today"]}
    open_tabs = [{"title": "News", "url": "https://www.news.example.org/today"}, tab]
    pairs += [pair(f"{f}/exact", f, None, rules=tabs, value=open_tabs),
              pair(f"{f}/near", f, None, rules=tabs, value=[*open_tabs, {"title": "New Tab", "url": "chrome://newtab/"}]),
              pair(f"{f}/far", f, None, rules=tabs,
                   value=[{"title": "Guide", "url": docs}, {"title": "Guide", "url": docs}]),
              pair(f"{f}/none", f, None, rules=tabs, value=[])]
    f = "is_expected_bookmarks"
    bookmarks = {"bookmark_bar": {"children": [
        {"type": "folder", "name": "Liked Authors", "children": [
            {"type": "url", "name": "A", "url": "https://authors.example.org/a"},
            {"type": "url", "name": "B", "url": "https://authors.example.org/b2"}]},
        {"type": "folder", "name": "Recipes", "children": []},
        {"type": "url", "name": "Guide", "url": docs}]}, "other": {"children": []}}
    liked = {"type": "liked_authors_websites_urls",
             "urls": ["https://authors.example.org/a", ["https://authors.example.org/b", "https://authors.example.org/b2"]]}
    pairs += [pair(f"{f}/folders", f, None, rules={"type": "bookmark_bar_folders_names",
                                                    "names": ["Recipes", "Liked Authors"]}, value=bookmarks),
              pair(f"{f}/folders-near", f, None, rules={"type": "bookmark_bar_folders_names", "names": ["Recipes"]},
                   value=bookmarks),
              pair(f"{f}/urls", f, None, rules={"type": "bookmark_bar_websites_urls", "urls": [docs]}, value=bookmarks),
              pair(f"{f}/liked", f, None, rules=liked, value=bookmarks),
              pair(f"{f}/liked-far", f, None, rules={**liked, "urls": ["https://authors.example.org/a"]},
                   value=bookmarks),
              pair(f"{f}/none", f, None, rules=liked, value={})]
    f = "check_history_deleted"
    history = [["https://shop.example.org/cart", "Cart", 3], ["https://docs.example.org/", "Docs", 1]]
    keywords = {"type": "keywords", "keywords": ["shop.example", "tickets"]}
    pairs += [pair(f"{f}/deleted", f, None, rules=keywords, value=history[1:]),
              pair(f"{f}/kept", f, None, rules=keywords, value=history),
              pair(f"{f}/near", f, None, rules={**keywords, "keywords": ["shop.example.org/basket"]}, value=history),
              pair(f"{f}/empty", f, None, rules=keywords, value=[])]
    f = "is_cookie_deleted"
    cookies = [[1, ".shop.example.org", "session"], [2, "docs.example.org", "theme"]]
    domains = {"type": "domains", "domains": ["docs.example.org"]}
    pairs += [pair(f"{f}/kept", f, None, rules=domains, value=cookies),
              pair(f"{f}/deleted", f, None, rules=domains, value=cookies[:1]),
              pair(f"{f}/www", f, None, rules={"type": "domains", "domains": ["www.docs.example.org"]}, value=cookies),
              pair(f"{f}/empty", f, None, rules=domains, value=[])]
    f = "check_enabled_experiments"
    names = {"type": "names", "names": ["smooth-scrolling", "enable-parallel-downloading"]}
    pairs += [pair(f"{f}/exact", f, None, rules=names, value=["smooth-scrolling@2", "enable-parallel-downloading@1"]),
              pair(f"{f}/order", f, None, rules=names, value=["enable-parallel-downloading@1", "smooth-scrolling@2"]),
              pair(f"{f}/near", f, None, rules=names, value=["smooth-scrolling@2"]),
              pair(f"{f}/none", f, None, rules=names, value=[])]
    f = "check_font_size"
    pairs += [pair(f"{f}/value", f, None, rules={"type": "value", "value": 20}, value={"default_font_size": 20}),
              pair(f"{f}/value-near", f, None, rules={"type": "value", "value": 20}, value={"default_font_size": 21}),
              pair(f"{f}/range", f, None, rules={"type": "range", "min": 16, "max": 24},
                   value={"default_font_size": 20}),
              pair(f"{f}/range-edge", f, None, rules={"type": "range", "min": 16, "max": 24},
                   value={"default_font_size": 24})]
    f = "is_expected_installed_extensions"
    pairs += [pair(f"{f}/exact", f, None, rules={"type": "name", "expected": ["Dark Reader"]},
                   value=["Dark Reader", "uBlock Origin"]),
              pair(f"{f}/near", f, None, rules={"type": "name", "expected": ["Dark Reader", "Todoist"]},
                   value=["Dark Reader", "uBlock Origin"]),
              pair(f"{f}/far", f, None, rules={"type": "name", "expected": ["Todoist"]}, value=["uBlock Origin"]),
              pair(f"{f}/none", f, None, rules={"type": "name", "expected": ["Todoist"]}, value=[])]
    f = "is_shortcut_on_desktop"
    shortcut = "[Desktop Entry]\nVersion=1.0\nName=Docs Guide\nExec=chromium --app=https://docs.example.org\n"
    pairs += [pair(f"{f}/exact", f, None, rules={"type": "name", "name": "Docs Guide"},
                   value={"/home/user/Desktop/docs.desktop": shortcut}),
              pair(f"{f}/near", f, None, rules={"type": "name", "name": "Docs"},
                   value={"/home/user/Desktop/docs.desktop": shortcut}),
              pair(f"{f}/far", f, None, rules={"type": "name", "name": "Docs Guide"},
                   value={"/home/user/Desktop/other.desktop": "[Desktop Entry]\nName=Other\n"}),
              pair(f"{f}/none", f, None, rules={"type": "name", "name": "Docs Guide"}, value={})]
    return pairs


def _odt(paragraphs: list[str], highlight: str | None = None, colour: str = "#ffff00") -> bytes:
    """An OpenDocument text as Writer saves one (mimetype first and stored, the manifest, content.xml):
    one text:p each, with `highlight` in a span of an automatic style whose background is `colour`."""
    ns = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
          'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" '
          'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
          'xmlns:fo="urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0"')
    body = ""
    for p in paragraphs:
        if highlight and highlight in p:
            before, _, after = p.partition(highlight)
            p = f'{before}<text:span text:style-name="T1">{highlight}</text:span>{after}'
        body += f'<text:p text:style-name="P1">{p}</text:p>'
    content = (f'<?xml version="1.0" encoding="UTF-8"?>\n<office:document-content {ns} office:version="1.3">'
               '<office:automatic-styles><style:style style:name="P1" style:family="paragraph"/>'
               '<style:style style:name="T1" style:family="text">'
               f'<style:text-properties fo:background-color="{colour}"/>'
               '</style:style></office:automatic-styles>'
               f'<office:body><office:text>{body}</office:text></office:body></office:document-content>')
    manifest = ('<?xml version="1.0" encoding="UTF-8"?>\n<manifest:manifest '
                'xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0" manifest:version="1.3">'
                '<manifest:file-entry manifest:full-path="/" '
                'manifest:media-type="application/vnd.oasis.opendocument.text"/>'
                '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"/>'
                '</manifest:manifest>')
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in (("mimetype", "application/vnd.oasis.opendocument.text"),
                           ("META-INF/manifest.xml", manifest), ("content.xml", content)):
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED if name == "mimetype" else zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return out.getvalue()


def _odt_pairs(root: str) -> list[Pair]:
    text = ["Call the office on Tuesday.", "Bring the signed forms."]
    _write(root, "odt/gold.odt", _odt(text))
    _write(root, "odt/task.odt", _odt(text, highlight="Tuesday"))
    _write(root, "odt/near.odt", _odt(["Call the office on Tuesday", text[1]]))
    _write(root, "odt/upper.odt", _odt(text, highlight="Tuesday", colour="#FFFF00"))
    _write(root, "odt/green.odt", _odt(text, highlight="Tuesday", colour="#00ff00"))
    _write(root, "odt/far.odt", _odt(["Dear Ana,", "See you soon."]))
    _write(root, "odt/bad.odt", b"PK\x03\x04 not a document")
    f = "check_highlighted_words"
    return [pair(f"{f}/exact", f, "odt/gold.odt", "odt/gold.odt"),
            pair(f"{f}/untouched", f, "odt/task.odt", "odt/gold.odt"),
            pair(f"{f}/near", f, "odt/near.odt", "odt/gold.odt"),
            pair(f"{f}/upper-case-colour", f, "odt/upper.odt", "odt/gold.odt"),
            pair(f"{f}/green", f, "odt/green.odt", "odt/gold.odt"),
            pair(f"{f}/far", f, "odt/far.odt", "odt/gold.odt"),
            pair(f"{f}/malformed", f, "odt/bad.odt", "odt/gold.odt")]


def _value_metric_pairs(root: str) -> list[Pair]:
    """Metrics of a getter's value or a command's output: literal_match, check_direct_json_object,
    check_moved_jpgs, is_in_vm_clickboard, is_extension_installed; and check_json_keybindings (a file)."""
    f = "literal_match"
    pairs = [pair(f"{f}/exact", f, None, rules="Hello", text="Hello"),
             pair(f"{f}/case", f, None, rules="hello", text="Hello", ignore_case=True),
             pair(f"{f}/near", f, None, rules="Hello", text="Hello "),
             pair(f"{f}/number", f, None, rules="3", value=3),
             pair(f"{f}/list", f, None, rules=["a", "b"], value=["a", "B"], type="list", ignore_case=True),
             pair(f"{f}/list-short", f, None, rules=["a", "b"], value=["a"], type="list"),
             pair(f"{f}/list-text", f, None, rules=["a", "b"], text="a,b", type="list")]
    f = "check_direct_json_object"
    want = {"expected": {"name": "Ana Lima", "age": 41}}
    pairs += [pair(f"{f}/exact", f, None, rules=want, text='{"name": "Ana Lima", "age": 41, "city": "Porto"}\n'),
              pair(f"{f}/quotes", f, None, rules=want, text="{'name': 'Ana Lima', 'age': 41}"),
              pair(f"{f}/value", f, None, rules=want, value={"name": "Ana Lima", "age": 41}),
              pair(f"{f}/near", f, None, rules=want, value={"name": "Ana Lima", "age": 42}),
              pair(f"{f}/in-result", f, None, rules={"expected": {"name": "Ana", "tags": ["z", "y"]},
                                                     "expect_in_result": True},
                   value={"name": "Ana Lima", "tags": ["x", "y"]}),
              pair(f"{f}/in-result-far", f, None, rules={"expected": {"name": "Rui"}, "expect_in_result": True},
                   value={"name": "Ana Lima"}),
              pair(f"{f}/missing-key", f, None, rules=want, value={"name": "Ana Lima"}),
              pair(f"{f}/malformed", f, None, rules=want, text="name: Ana Lima")]
    f = "check_moved_jpgs"
    jpgs = {"expected": ["beach.jpg", "dog.jpg"]}

    def folder(*names: str) -> dict[str, Any]:
        return {"name": "photos", "type": "directory", "children": [{"name": n, "type": "file"} for n in names]}
    pairs += [pair(f"{f}/exact", f, None, rules=jpgs, value=folder("dog.jpg", "beach.jpg")),
              pair(f"{f}/near", f, None, rules=jpgs, value=folder("dog.jpg")),
              pair(f"{f}/twice", f, None, rules=jpgs, value=folder("dog.jpg", "dog.jpg")),
              pair(f"{f}/far", f, None, rules=jpgs, value=folder("notes.txt", "cat.png", "dog.jpg"))]
    f = "is_in_vm_clickboard"
    clipboard = "Order 1182 shipped to Porto\n"
    pairs += [pair(f"{f}/exact", f, None, rules=clipboard, value={"expected": "Order 1182"}),
              pair(f"{f}/list", f, None, rules=clipboard, value={"expected": ["1182", "Porto"]}),
              pair(f"{f}/near", f, None, rules=clipboard, value={"expected": ["1182", "Lisbon"]}),
              pair(f"{f}/far", f, None, rules="", value={"expected": "Order 1182"})]
    f = "is_extension_installed"
    listing = "ms-python.python\nms-toolsai.jupyter\n"
    pairs += [pair(f"{f}/exact", f, None, text=listing, rules={"type": "contain", "expected": "ms-python.python"}),
              pair(f"{f}/near", f, None, text=listing, rules={"type": "contain", "expected": "ms-python.pylance"}),
              pair(f"{f}/absent", f, None, text=listing, rules={"type": "not_contain", "expected": "vscodevim.vim"}),
              pair(f"{f}/present", f, None, text=listing, rules={"type": "not_contain", "expected": "jupyter"})]
    bindings = [{"key": "ctrl+j", "command": "workbench.action.togglePanel"},
                {"key": "ctrl+f1", "command": "workbench.action.files.save", "when": "editorTextFocus"}]
    _write(root, "vscode/keybindings.json", json.dumps(bindings, indent=4) + "\n")
    _write(root, "vscode/commented.json", "// Place your key bindings in this file\n" + json.dumps(bindings) + "\n")
    _write(root, "vscode/near.json", json.dumps([bindings[0]]) + "\n")
    _write(root, "vscode/bad.json", "[{\"key\": ")
    f = "check_json_keybindings"
    want_b = {"expected": bindings[1]}
    pairs += [pair(f"{f}/exact", f, "vscode/keybindings.json", rules=want_b),
              pair(f"{f}/comment-line", f, "vscode/commented.json", rules=want_b),
              pair(f"{f}/near", f, "vscode/near.json", rules=want_b),
              pair(f"{f}/near-when", f, "vscode/keybindings.json",
                   rules={"expected": {**bindings[1], "when": "editorFocus"}}),
              pair(f"{f}/malformed", f, "vscode/bad.json", rules=want_b)]
    return pairs


def _xcu(**props: tuple[str, str]) -> str:
    """LibreOffice's registrymodifications.xcu with each setting (name: (path, value))."""
    items = "".join(f'<item oor:path="{path}"><prop oor:name="{name}" oor:op="fuse"><value>{value}</value></prop>'
                    '</item>\n'
                    for name, (path, value) in props.items())
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<oor:items xmlns:oor="http://openoffice.org/2001/registry" '
            'xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">\n'
            '<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="FirstRun" oor:op="fuse">'
            f'<value>false</value></prop></item>\n{items}</oor:items>\n')


def _numbered_deck(number_rgb: str) -> bytes:
    """A deck whose slide master fills its slide number's text in number_rgb (Impress writes that fill as
    the master's last solid RGB fill but one; a footer's fill follows it)."""
    import re

    with zipfile.ZipFile(io.BytesIO(_pptx([("Numbers", "One")]))) as z:
        members = {name: z.read(name) for name in z.namelist()}
    fills = "".join(f'<a:p><a:r><a:rPr><a:solidFill><a:srgbClr val="{v}"/></a:solidFill></a:rPr><a:t>{t}</a:t>'
                    '</a:r></a:p>'
                    for v, t in (("1F1F1F", "title"), (number_rgb, "number"), ("595959", "footer")))
    shape = ('<p:sp><p:nvSpPr><p:cNvPr id="90" name="Numbers"/><p:cNvSpPr/><p:nvPr/></p:nvSpPr><p:spPr/>'
             f'<p:txBody><a:bodyPr/>{fills}</p:txBody></p:sp>')
    xml = members["ppt/slideMasters/slideMaster1.xml"]
    members["ppt/slideMasters/slideMaster1.xml"] = re.sub(rb"(</p:spTree>)", shape.encode() + rb"\1", xml, count=1)
    return _zip(members)


def _picture_deck(box: tuple[float, float, float, float] | None) -> bytes:
    """A 10 x 7.5 inch deck with one picture on its first slide at (left, top, width, height) in inches."""
    import datetime

    from PIL import Image
    from pptx import Presentation
    from pptx.util import Inches

    deck = Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[6])
    if box is not None:
        left, top, width, height = (Inches(v) for v in box)
        slide.shapes.add_picture(io.BytesIO(_png(Image.fromarray(_picture(2)))), left, top, width, height)
    deck.core_properties.created = deck.core_properties.modified = datetime.datetime(2024, 1, 1)
    out = io.BytesIO()
    deck.save(out)
    return _restamped(out.getvalue())


def _impress_setting_pairs(root: str) -> list[Pair]:
    """Impress's settings and master: check_presenter_console_disable, check_auto_saving_time (the user's
    registrymodifications.xcu), check_page_number_colors (the master), check_image_stretch_and_center."""
    start, save = "/org.openoffice.Office.Impress/Misc/Start", "/org.openoffice.Office.Common/Save/Document"
    _write(root, "lo/off.xcu", _xcu(EnablePresenterScreen=(start, "false"), AutoSaveTimeIntervall=(save, "3")))
    _write(root, "lo/on.xcu", _xcu(EnablePresenterScreen=(start, "true"), AutoSaveTimeIntervall=(save, "10")))
    _write(root, "lo/untouched.xcu", _xcu())
    _write(root, "lo/bad.xcu", "<oor:items><item>")
    f = "check_presenter_console_disable"
    pairs = [pair(f"{f}/exact", f, "lo/off.xcu"), pair(f"{f}/near", f, "lo/on.xcu"),
             pair(f"{f}/untouched", f, "lo/untouched.xcu"), pair(f"{f}/malformed", f, "lo/bad.xcu")]
    f = "check_auto_saving_time"
    pairs += [pair(f"{f}/exact", f, "lo/off.xcu", rules={"minutes": 3}),
              pair(f"{f}/near", f, "lo/on.xcu", rules={"minutes": 3}),
              pair(f"{f}/untouched", f, "lo/untouched.xcu", rules={"minutes": 3}),
              pair(f"{f}/malformed", f, "lo/bad.xcu", rules={"minutes": 3})]
    for name, rgb in (("red", "FF0000"), ("dark-red", "C00000"), ("blue", "0000FF"), ("sky", "3366FF"),
                      ("green", "00B050"), ("black", "000000"), ("grey", "404040")):
        _write(root, f"pptx/number-{name}.pptx", _numbered_deck(rgb))
    f = "check_page_number_colors"
    pairs += [pair(f"{f}/{name}-{color}", f, f"pptx/number-{name}.pptx", rules={"color": color})
              for name, color in (("red", "red"), ("dark-red", "red"), ("blue", "red"), ("blue", "blue"),
                                  ("sky", "blue"), ("green", "green"), ("black", "black"), ("grey", "black"))]
    pairs.append(pair(f"{f}/malformed", f, "pptx/bad.pptx", rules={"color": "red"}))
    _write(root, "pptx/picture.pptx", _picture_deck((3, 2, 4, 3)))
    _write(root, "pptx/stretched.pptx", _picture_deck((0, 0, 10, 7.5)))
    _write(root, "pptx/nearly.pptx", _picture_deck((0.3, 0.2, 9.6, 7.2)))
    _write(root, "pptx/off-centre.pptx", _picture_deck((1, 0, 10, 7.5)))
    _write(root, "pptx/no-picture.pptx", _picture_deck(None))
    f = "check_image_stretch_and_center"
    pairs += [pair(f"{f}/exact", f, "pptx/stretched.pptx", "pptx/picture.pptx"),
              pair(f"{f}/near", f, "pptx/nearly.pptx", "pptx/picture.pptx"),
              pair(f"{f}/off-centre", f, "pptx/off-centre.pptx", "pptx/picture.pptx"),
              pair(f"{f}/untouched", f, "pptx/picture.pptx", "pptx/picture.pptx"),
              pair(f"{f}/no-picture", f, "pptx/no-picture.pptx", "pptx/picture.pptx"),
              pair(f"{f}/malformed", f, "pptx/bad.pptx", "pptx/picture.pptx")]
    return pairs


def _mbox(*messages: tuple[str, str, str]) -> str:
    """A Thunderbird folder (mbox): each message a `From - ` line, its headers and body."""
    return "".join(f"From - Mon Jan  1 00:00:00 2024\nX-Mozilla-Status: {status}\nX-Mozilla-Status2: 00000000\n"
                   f"Subject: {subject}\nFrom: ana@example.org\n\n{body}\n\n" for subject, status, body in messages)


def _thunderbird_folder_pairs(root: str) -> list[Pair]:
    """check_thunderbird_folder: the folder's mbox against the gold one."""
    mail = [("Invoice 1182", "0001", "Please find it attached."), ("Lunch", "0001", "Noon?")]
    _write(root, "tb/Invoices", _mbox(*mail))
    _write(root, "tb/Invoices-read", _mbox(*[(s, "0000", b) for s, _, b in mail]))
    _write(root, "tb/Invoices-one", _mbox(mail[0]))
    _write(root, "tb/Invoices-other", _mbox(("Newsletter", "0001", "Sale!")))
    _write(root, "tb/Invoices-empty", "")
    _write(root, "tb/Invoices-bad", b"\xff\xfeFrom - \x81")
    f = "check_thunderbird_folder"
    return [pair(f"{f}/exact", f, "tb/Invoices", "tb/Invoices"),
            pair(f"{f}/status", f, "tb/Invoices-read", "tb/Invoices"),
            pair(f"{f}/status-ignored", f, "tb/Invoices-read", "tb/Invoices", ignore_status=True),
            pair(f"{f}/near", f, "tb/Invoices-one", "tb/Invoices"),
            pair(f"{f}/far", f, "tb/Invoices-other", "tb/Invoices"),
            pair(f"{f}/empty", f, "tb/Invoices-empty", "tb/Invoices"),
            pair(f"{f}/malformed", f, "tb/Invoices-bad", "tb/Invoices")]


def _speedtest_pairs(root: str) -> list[Pair]:
    """compare_time_in_speedtest_results reads the clock: its files hold times relative to now (as a speed
    test's export made just before the check), `clock` pairs whose bytes differ from run to run (their
    sha256 is not recorded). Now and three hours off are far from the 60-minute bound, so the numbers do
    not: the quoted date and the date ending its line read as no time on both sides, to the character."""
    from datetime import datetime, timedelta

    now = datetime.now()
    three_hours = now - timedelta(hours=3)
    f = "compare_time_in_speedtest_results"
    files = {"exact": f"Server,Date,Download\nX,{now:%m/%d/%Y %H:%M},90.1\n",
             "far": f"Server,Date,Download\nX,{three_hours:%m/%d/%Y %H:%M},90.1\n",
             "quoted": f'Server,Date,Download\nX,"{now:%m/%d/%Y %H:%M}",90.1\n',
             "line-end": f"Server,Date\nX,{now:%m/%d/%Y %H:%M}\n",
             "malformed": "Server,Date,Download\n"}
    pairs = [pair(f"{f}/{n}", f, _write(root, f"speedtest/{n}.csv", text), rules="60")  # type: ignore[arg-type]
             for n, text in files.items()]
    for p in pairs:
        p["clock"] = True
    return pairs


def make(root: str) -> list[Pair]:
    pairs: list[Pair] = []
    for part in (_image_pairs, _more_image_pairs, _pdf_pairs, _text_pairs, _text_file_pairs, _string_pairs,
                 _os_text_pairs, _archive_pairs, _epub_pairs, _sqlite_pairs, _docx_pairs, _table_pairs, _slide_pairs,
                 _rule_file_pairs, _file_file_pairs, _docx_format_pairs, _slide_metric_pairs, _docx_content_pairs,
                 _tabstop_pairs, _vlc_pairs, _thunderbird_pairs, _a11y_pairs, _speedtest_pairs,
                 _chrome_pairs, _table_props_pairs, _odt_pairs,
                 _value_metric_pairs, _impress_setting_pairs, _thunderbird_folder_pairs):
        pairs += part(root)
    return pairs


def digests(root: str, pairs: list[Pair]) -> dict[str, str]:
    """Every file's sha256, by its name under root; not those of `clock` pairs (made relative to now)."""
    names = sorted({p[k] for p in pairs for k in ("result", "expected") if p[k] and not p.get("clock")})
    out = {}
    for name in names:
        with open(os.path.join(root, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def libraries() -> dict[str, str | None]:
    """The versions of the guest's libraries that write the files or read them for us (None: absent)."""
    import importlib.metadata

    found: dict[str, str | None] = {}
    for name in ("python-docx", "openpyxl", "python-pptx", "pillow", "numpy", "pymupdf", "rapidfuzz"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def spec(root: str, p: Pair) -> dict[str, Any]:
    """The check's spec for a pair, as the importer writes it (gh_osworld/spec.py): the agent's file by
    vm_file, the gold file embedded, OSWorld's rules by the rule getter."""
    result: dict[str, Any] = {"type": "vm_file", "path": os.path.join(root, p["result"] or "absent/file"),
                              "dest": "r"}
    if p["text"] is not None:
        result = {"type": "vm_command_line", "command": ["printf", "%s", p["text"]]}
    elif p.get("value") is not None:
        result = {"type": "rule", "rules": p["value"]}  # the rule getter hands its `rules` over as they are
    elif p.get("read"):
        result = {"type": "vm_command_line", "command": ["cat", os.path.join(root, p["result"])]}
    expected: dict[str, Any] | None = None
    if p["rules"] is not None:
        expected = {"type": "rule", "rules": p["rules"]}
    elif p["expected"] is not None:
        expected = {"type": "embedded_file", "path": os.path.join(root, p["expected"])}
    return {"conj": "and", "metrics": [{"func": p["func"], "result": result, "expected": expected,
                                        "options": p["options"]}]}


def ours(root: str, pairs: list[Pair]) -> dict[str, float | None]:
    """Our score of every pair through gh_osworld's own evaluation (None: no verdict, a crash)."""
    import contextlib

    from gh_osworld.evaluate import evaluate
    from gh_osworld.spec import parse

    scores: dict[str, float | None] = {}
    for p in pairs:
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                scores[p["id"]] = evaluate(parse(spec(root, p)))
        except Exception:
            scores[p["id"]] = None
    return scores


if __name__ == "__main__":
    mode, where = sys.argv[1], sys.argv[2]
    made = make(where)
    if mode == "make":
        print(json.dumps({"pairs": made, "sha256": digests(where, made), "guest": libraries()}))
    elif mode == "ours":
        print(json.dumps(ours(where, made)))
    else:
        sys.exit(f"usage: {sys.argv[0]} make|ours DIR")
