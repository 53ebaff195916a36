"""The `gh-runner` command: the runner's own CLI, with the commands that need both halves added."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from gh_local import export, local, validate
from gh_local.osworld import importer as osworld_importer
from gh_runner import cli as runner_cli


def main(argv: Sequence[str] | None = None) -> int:
    return runner_cli.main(argv, commands={"local": local.main, "validate": validate.main,
                                                 "import osworld": osworld_importer.main,
                                                 "export": export.main})


if __name__ == "__main__":
    sys.exit(main())
