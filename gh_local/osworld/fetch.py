"""Files a task downloads (`download` steps, `cloud_file` expectations), fetched once at import time.

Stored content-addressed in --files-dir (`sha256/<hex>`), so re-importing a benchmark or two tasks with
the same file keep one copy, and `urls.json` there remembers which URL gave which content, so a second
import does not fetch again. Every request is bounded: a connect/read timeout per operation, a deadline
for the whole file, and a size cap, so one slow or huge file cannot hang or fill an import.

Offline (`offline=True`, `gh-runner import osworld --offline`): nothing is fetched; a file not already in
--files-dir is download_failed, "not in --files-dir (run --fetch-only where there is network)". The
layout DIR/sha256/<hex> is also what `image-builder/build osworld-desktop --files-dir DIR` copies into the
image's file store, so the directory a lab copies over serves both.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from gh_local.osworld.skips import Skip, SkipReason

FETCH_TIMEOUT = 30.0  # seconds per connect or read
FETCH_DEADLINE = 300.0  # seconds for one whole file
FETCH_MAX_BYTES = 64 * 1024 * 1024
NOT_IN_FILES_DIR = "not in --files-dir (run --fetch-only where there is network)"


@dataclass(frozen=True)
class Blob:
    """A fetched file: its content and its sha256 (the name it has in --files-dir and in a file store)."""

    data: bytes
    sha256: str


class Fetcher:
    def __init__(self, files_dir: Path, *, timeout: float = FETCH_TIMEOUT, deadline: float = FETCH_DEADLINE,
                 max_bytes: int = FETCH_MAX_BYTES, offline: bool = False) -> None:
        self.files_dir = files_dir
        self.offline = offline
        self.fetched: dict[str, str] = {}  # url -> sha256 of every file asked for that is in files_dir
        self.failed: dict[str, str] = {}  # url -> why it is not
        self.timeout, self.deadline, self.max_bytes = timeout, deadline, max_bytes
        self._index_path = files_dir / "urls.json"
        self._index: dict[str, str] | None = None
        self._client: httpx.Client | None = None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _urls(self) -> dict[str, str]:
        if self._index is None:
            try:
                self._index = dict(json.loads(self._index_path.read_text()))
            except (OSError, ValueError):
                self._index = {}
        return self._index

    def _blob(self, digest: str) -> Path:
        return self.files_dir / "sha256" / digest

    def get(self, url: str, where: str) -> bytes:
        """The content at `url`; raise Skip (download_failed, download_too_large) naming `where`, the host and
        the error."""
        return self.blob(url, where).data

    def blob(self, url: str, where: str) -> Blob:
        """The content at `url` with its sha256; raise Skip as `get` does."""
        try:
            blob = self._get(url)
        except Skip as s:
            self.failed[url] = f"{s.reason}: {s.detail}"
            raise Skip(s.reason, f"{where}: {s.detail}") from None
        self.fetched[url] = blob.sha256
        return blob

    def _get(self, url: str) -> Blob:
        known = self._urls().get(url)
        if known and self._blob(known).is_file():
            return Blob(self._blob(known).read_bytes(), known)
        if self.offline:
            raise Skip(SkipReason.DOWNLOAD_FAILED, f"{urlsplit(url).hostname or url[:80]}: {NOT_IN_FILES_DIR}")
        data = self._download(url)
        digest = hashlib.sha256(data).hexdigest()
        blob = self._blob(digest)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.is_file():
            _write_atomic(blob, data)
        self._urls()[url] = digest
        _write_atomic(self._index_path, (json.dumps(self._urls(), indent=1, sort_keys=True) + "\n").encode())
        return Blob(data, digest)

    def _download(self, url: str) -> bytes:
        host = urlsplit(url).hostname or url[:80]
        if urlsplit(url).scheme not in ("http", "https"):
            raise Skip(SkipReason.DOWNLOAD_FAILED, f"{url[:200]}: not an http(s) URL")
        if self._client is None:
            self._client = httpx.Client(timeout=httpx.Timeout(self.timeout), follow_redirects=True)
        started = time.monotonic()
        chunks: list[bytes] = []
        size = 0
        try:
            with self._client.stream("GET", url) as r:
                if r.status_code != 200:
                    raise Skip(SkipReason.DOWNLOAD_FAILED, f"{host}: HTTP {r.status_code}")
                for chunk in r.iter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise Skip(SkipReason.DOWNLOAD_TOO_LARGE,
                                   f"{host}: more than {self.max_bytes:,} bytes")
                    if time.monotonic() - started > self.deadline:
                        raise Skip(SkipReason.DOWNLOAD_FAILED, f"{host}: not complete after {self.deadline:.0f} s")
                    chunks.append(chunk)
        except httpx.HTTPError as e:
            raise Skip(SkipReason.DOWNLOAD_FAILED, f"{host}: {type(e).__name__}: {e}"[:300]) from None
        return b"".join(chunks)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".partial-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
