"""The README's Quick tour, read as a newcomer follows it: every gh-runner and gh-server command in it
parses with the real parsers (so a flag or subcommand it shows exists), the runner's token comes from
a step the tour shows, the SDK calls it makes exist in the installed SDK, and it ends by opening the
results page."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _tour() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## Quick tour")
    return text[start:text.index("\n## ", start + 1)]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _tour(), re.S)


def _commands() -> list[list[str]]:
    """Each shell command of the tour, continuation lines joined, comments and pipes cut."""
    out = []
    for block in _blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" # ")[0].split(" | ")[0].split(" > ")[0].strip()
            if line and not line.startswith("#"):
                out.append(shlex.split(line))
    return out


def test_every_gh_command_in_the_tour_parses() -> None:
    from gh_runner.cli import build_parser
    from gh_server.cli import parser as server_parser

    seen = {"gh-runner": 0, "gh-server": 0}
    for argv in _commands():
        prog = Path(argv[0]).name
        if prog not in seen:
            continue
        p = build_parser() if prog == "gh-runner" else server_parser()
        try:
            p.parse_args(argv[1:])
        except SystemExit as e:  # argparse's way of saying the tour shows a flag that does not exist
            pytest.fail(f"README Quick tour: `{shlex.join(argv)}` does not parse (exit {e.code})")
        seen[prog] += 1
    assert seen["gh-runner"] >= 4 and seen["gh-server"] >= 2, seen


def test_the_runner_token_comes_from_a_step_the_tour_shows() -> None:
    cmds = _commands()
    runner = next(i for i, c in enumerate(cmds) if Path(c[0]).name == "gh-runner" and "--server" in c)
    argv = cmds[runner]
    assert "--token" not in argv or "…" not in argv[argv.index("--token") + 1], "a token it never showed how to get"
    token_file = argv[argv.index("--token-file") + 1]
    made = [c for c in cmds[:runner] if Path(c[0]).name == "gh-server" and c[1:3] == ["runners", "create"]]
    assert made, "no `gh-server runners create` step before the runner starts"
    assert re.search(rf"runners create .*> {re.escape(token_file)}", _tour()), "the token is not written to the file"


def test_the_sdk_calls_exist_and_the_tour_ends_in_the_console() -> None:
    from guidinghand import Eager

    (code,) = _blocks("python")
    tree = ast.parse(code)
    client = Eager(api_key="gh_live_x", base_url="http://127.0.0.1:1")
    calls = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "client":
            calls.add((node.value.attr, node.attr))
    assert calls >= {("test_cases", "batch"), ("test_runs", "create"), ("test_runs", "wait")}, calls
    for resource, method in calls:
        assert callable(getattr(getattr(client, resource), method)), (resource, method)
    tour = _tour()
    last_step = tour[tour.rindex("\n7. "):]
    assert "Open the console: `http://HOST:8700/`" in last_step and "sign in with the admin key" in last_step, \
        "the tour does not end in the console"
    assert all(tab in last_step for tab in ("Evals tab", "Runners tab", "Start states")), "a tab the tour skips"
