"""Debian's Chromium (/usr/bin/chromium, headless) driven by Playwright's Python package, and signing in to
the console as a person does: the one way every browser test starts."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"


@contextmanager
def chromium() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no {CHROMIUM}: scripts/setup.sh installs Debian's chromium")
    with sync_playwright() as pw:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium's sandbox refuses to run as root
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            yield b
        finally:
            b.close()


def sign_in(page: Page, key: str, path: str = "/") -> None:
    """Open the console, type the key into the field named "API key", press "Sign in"."""
    page.goto(path)
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible(timeout=30_000)
