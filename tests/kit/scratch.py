"""Scratch directories for machines' files. QEMU runs as libvirt-qemu and must traverse every parent of
an overlay or state file, so they live under /var/tmp with mode 0755: never in the checkout, nor under
pytest's 0700 tmp dirs."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path("/var/tmp")


def traversable_tmpdir(prefix: str) -> Path:
    """A new directory under /var/tmp that libvirt-qemu can traverse; the caller removes it."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=ROOT))
    d.chmod(0o755)
    return d


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """`traversable_tmpdir`, removed with everything in it when the block ends."""
    d = traversable_tmpdir(prefix)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
