"""What a replay page shows, read the way a test reads it: the timeline the page embeds as JSON in its
`<script id="replay-data">` (gh_server's replay template), with its frames in order."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def replay_data(page: str | Path) -> dict[str, Any]:
    """The embedded timeline of a replay page (its HTML, or the path of a saved page)."""
    html = page.read_text() if isinstance(page, Path) else page
    m = re.search(r'id="replay-data">(.*?)</script>', html, re.S)
    assert m, html[:300]
    return dict(json.loads(m.group(1)))
