"""Registering and revoking runners: one home for what `POST/DELETE /v1/runners` and `gh-server runners`
both do, so a runner made either way is the same row and a token revoked either way stops working."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gh_server.auth import hash_secret, new_runner_token
from gh_server.models import Runner, new_id, utcnow
from gh_server.settings import Settings


def parse_labels(text: str) -> list[str]:
    """`a,b` -> ["a", "b"] (blanks and repeats dropped, order kept)."""
    return list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))


def register(session: Session, name: str, labels: list[str] | None = None) -> tuple[Runner, str]:
    """A new runner row and its plain token (shown once; only its hash is stored)."""
    token = new_runner_token()
    row = Runner(id=new_id("rn_"), name=name, token_hash=hash_secret(token), labels=list(labels or []),
                 images=[], held_versions=[])
    session.add(row)
    session.flush()
    return row, token


def revoke(session: Session, runner_id: str) -> bool:
    """Revoke a runner's token; False when there is no such runner (or it was revoked already)."""
    row = session.get(Runner, runner_id)
    if row is None or row.revoked_at is not None:
        return False
    row.revoked_at = utcnow()
    # The hash of no token: the old token stops matching even for a gateway that ignores revoked_at.
    row.token_hash = f"revoked:{row.id}"
    return True


def main(sm: sessionmaker[Session], args: argparse.Namespace, settings: Settings) -> int:
    """`gh-server runners create|list|revoke` on the data dir's database."""
    if args.runners_command == "create":
        name = str(args.name).strip()
        if not name or len(name) > 200:
            print("gh-server: a runner name is 1 to 200 characters", file=sys.stderr)
            return 2
        labels = parse_labels(args.labels)
        with sm.begin() as s:
            row, token = register(s, name, labels)
            runner_id = row.id
        print(f"{runner_id} ({name}): {token}")
        print("Store it now: it is not shown again. Start the runner with it, for example:", file=sys.stderr)
        server = f"ws://{settings.host}:{settings.port}"
        label_flag = f" --labels {','.join(labels)}" if labels else ""
        print(f"  GH_RUNNER_TOKEN=<the token above> gh-runner --server {server} --name {name}{label_flag}",
              file=sys.stderr)
        return 0
    if args.runners_command == "list":
        with sm() as s:
            rows: list[Any] = list(s.scalars(select(Runner).order_by(Runner.created_at)))
        for r in rows:
            state = "revoked" if r.revoked_at else ("connected" if r.session_id else "offline")
            seen = r.last_seen_at.isoformat(timespec="seconds") if r.last_seen_at else "never"
            print(f"{r.id}\t{r.name}\t{state}\t{','.join(r.labels or []) or '-'}\tlast seen {seen}")
        return 0
    if args.runners_command == "revoke":
        with sm.begin() as s:
            if not revoke(s, args.runner_id):
                print(f"gh-server: no runner {args.runner_id} (or it is revoked already)", file=sys.stderr)
                return 1
        print(f"revoked {args.runner_id}: its token no longer connects; a connected runner is dropped at its "
              "next heartbeat")
        return 0
    return 2
