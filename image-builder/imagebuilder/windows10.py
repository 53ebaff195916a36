"""windows-10: the unattended Windows 10 22H2 build (in progress)."""

from __future__ import annotations

import argparse

from .errors import BuildError


def main(args: argparse.Namespace) -> int:
    raise BuildError("the windows-10 build is not implemented yet")
