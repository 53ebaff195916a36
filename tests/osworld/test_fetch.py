"""Fetching a task's files at import time: bounded in time and size, http(s) only, named by host."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gh_local.osworld.fetch import Fetcher
from gh_local.osworld.skips import Skip, SkipReason

from .conftest import Served


@pytest.fixture()
def dripping() -> Iterator[str]:
    """A server on 127.0.0.1 that promises 100 kB and sends 10 bytes every 0.2 s until the client leaves."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            try:
                while not stop.wait(0.2):
                    conn.sendall(b"x" * 10)
            except OSError:
                pass  # the client gave up: what the test waits for

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}/slow.bin"
    finally:
        stop.set()
        srv.close()
        t.join(timeout=10)


def test_a_whole_file_has_a_deadline(tmp_path: Path, dripping: str) -> None:
    f = Fetcher(tmp_path, timeout=5, deadline=1)
    with pytest.raises(Skip) as e:  # each read comes within its timeout: the whole file's deadline ends it
        f.get(dripping, "config[0]")
    f.close()
    assert (e.value.reason, e.value.detail) == (SkipReason.DOWNLOAD_FAILED,
                                                "config[0]: 127.0.0.1: not complete after 1 s")
    assert not list(tmp_path.iterdir())  # nothing kept of a file that did not arrive


def test_a_file_past_the_cap_is_refused(tmp_path: Path, served: Served) -> None:
    served.files["/big"] = b"y" * 5000
    f = Fetcher(tmp_path, max_bytes=1000)
    with pytest.raises(Skip) as e:
        f.get(served.url + "/big", "evaluator.expected")
    f.close()
    assert (e.value.reason, e.value.detail) == (SkipReason.DOWNLOAD_TOO_LARGE,
                                                "evaluator.expected: 127.0.0.1: more than 1,000 bytes")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "/etc/passwd", "ftp://127.0.0.1/x"])
def test_only_http_urls_are_fetched(tmp_path: Path, url: str) -> None:
    # A task must not be able to embed a file of the importing host in a case.
    with pytest.raises(Skip) as e:
        Fetcher(tmp_path).get(url, "config[0]")
    assert e.value.reason is SkipReason.DOWNLOAD_FAILED and "not an http(s) URL" in e.value.detail
