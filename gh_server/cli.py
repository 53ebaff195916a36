"""`gh-server`: serve the control plane, make API keys, upgrade the schema.

    gh-server --data-dir DIR --host 127.0.0.1 --port 8700 [--database-url postgresql://...]
    gh-server keys create --role member --name "ci" --data-dir DIR     # prints the key once
    gh-server keys list --data-dir DIR
    gh-server keys revoke ak_... --data-dir DIR
    gh-server runners create lab-1 [--labels lab,lenovo] --data-dir DIR  # prints the runner token once
    gh-server runners list --data-dir DIR
    gh-server runners revoke rn_... --data-dir DIR
    gh-server migrate --data-dir DIR                                    # schema to the newest revision

`keys` and `runners` work on the data dir's database directly, not through the API: they work before the
server first starts and without an API key (whoever can read the data dir can read the admin key anyway),
and a running server sees the change at once (a revoked runner is disconnected at its next heartbeat).

Exit codes: 0 done; 1 a command that ran and failed (no such key or runner); 2 a usage or configuration
error (a bad flag or settings file, a port already in use, a database that cannot be opened).

Every flag has an env twin GH_SERVER_<FLAG> (GH_SERVER_DATA_DIR, GH_SERVER_DATABASE_URL, GH_SERVER_HOST,
GH_SERVER_PORT, GH_SERVER_CONFIG); GH_SERVER_API_KEY sets the admin key. Flags win over the environment,
which wins over the --config YAML file (any Settings field: agents, judge, customer_model, runner_grace_seconds...).
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from importlib import metadata
from pathlib import Path

import pydantic
from sqlalchemy import select

from gh_server.listener import listen_socket
from gh_server.settings import Settings

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def version() -> str:
    # gh_server never imports gh_runner (the layer rule): the version comes from the installed distribution.
    try:
        return metadata.version("gh-runner")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _common(p: argparse.ArgumentParser, sub: bool = True) -> None:
    # In subcommands the default is SUPPRESS so `gh-server --data-dir X keys create` keeps X.
    default = argparse.SUPPRESS if sub else None
    p.add_argument("--data-dir", type=Path, default=default, help="state directory (SQLite database, admin key)")
    p.add_argument("--database-url", default=default, help="postgresql://... (default: SQLite in --data-dir)")
    p.add_argument("--config", type=Path, default=default, help="YAML settings file (agents, judge, ...)")


def _settings(args: argparse.Namespace) -> Settings:
    return Settings.from_env(
        config_file=getattr(args, "config", None),
        data_dir=args.data_dir,
        database_url=args.database_url,
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gh-server", description="Self-hosted GuidingHand evals control plane")
    _common(p, sub=False)
    p.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="listen port (default 8700)")
    p.add_argument("--public-url", default=None, help="base URL for links such as replay_url")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--version", action="version", version=f"gh-server {version()}")
    sub = p.add_subparsers(dest="command", metavar="{keys,runners,migrate}")
    keys = sub.add_parser("keys", help="make, list and revoke API keys")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    kc = ksub.add_parser("create", help="make a key and print it once")
    _common(kc)
    kc.add_argument("--role", choices=["admin", "member"], default="member")
    kc.add_argument("--name", default="member key")
    kl = ksub.add_parser("list", help="list keys (never their secrets)")
    _common(kl)
    kr = ksub.add_parser("revoke", help="revoke a key by id (ak_...)")
    _common(kr)
    kr.add_argument("key_id")
    runners = sub.add_parser("runners", help="register, list and revoke runners (their tokens)")
    rsub = runners.add_subparsers(dest="runners_command", required=True)
    rc = rsub.add_parser("create", help="register a runner and print its token (gh_rn_...) once",
                         description="Register a runner and print its token once, with the command that starts it.")
    _common(rc)
    rc.add_argument("name", metavar="NAME", help="the runner's name, as it shows in the API and names its machines")
    rc.add_argument("--labels", default="", metavar="A,B",
                    help="labels runs can ask for (runs_on); the runner advertises them with --labels")
    rl = rsub.add_parser("list", help="list runners (never their tokens)")
    _common(rl)
    rr = rsub.add_parser("revoke", help="revoke a runner's token by id (rn_...)")
    _common(rr)
    rr.add_argument("runner_id", metavar="ID")
    mg = sub.add_parser("migrate", help="upgrade the database schema to the newest revision")
    _common(mg)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.command is None:
        return serve(args)
    try:
        settings = _settings(args)
    except (ValueError, pydantic.ValidationError) as e:
        print(f"gh-server: bad settings: {e}", file=sys.stderr)
        return EXIT_USAGE
    from gh_server import db

    engine = db.make_engine(settings)
    try:
        db.upgrade(engine)
        if args.command == "runners":
            from gh_server import runner_admin

            return runner_admin.main(db.make_sessionmaker(engine), args, settings)
        if args.command == "migrate":
            print(f"schema at {db.current_revision(engine)}")
            return 0
        sm = db.make_sessionmaker(engine)
        from gh_server.auth import create_key
        from gh_server.models import ApiKey, utcnow

        if args.keys_command == "create":
            with sm.begin() as s:
                row, plain = create_key(s, args.name, args.role)
            print(f"{row.id} ({args.role}): {plain}")
            print("Store it now: it is not shown again.", file=sys.stderr)
            return 0
        if args.keys_command == "list":
            with sm() as s:
                for k in s.scalars(select(ApiKey).order_by(ApiKey.created_at)):
                    state = "revoked" if k.revoked_at else "active"
                    print(f"{k.id}\t{k.role}\t{state}\t{k.prefix}...\t{k.name}")
            return 0
        if args.keys_command == "revoke":
            with sm.begin() as s:
                key = s.get(ApiKey, args.key_id)
                if key is None:
                    print(f"no API key {args.key_id}", file=sys.stderr)
                    return EXIT_FAILED
                key.revoked_at = key.revoked_at or utcnow()
            print(f"revoked {args.key_id}")
            return 0
    finally:
        engine.dispose()
    return EXIT_USAGE


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gh_server.app import HTTP_KEEP_ALIVE_S, create_app
    from gh_server.live.sockets import LiveBoundedWebSockets

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = _settings(args)
    except (ValueError, pydantic.ValidationError) as e:
        print(f"gh-server: bad settings: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.public_url:
        settings.public_url = args.public_url
    # The port first: bound before anything starts, so a port in use is a configuration error said
    # at once (uvicorn would say it after "startup complete" and exit 3).
    try:
        sock = listen_socket(settings.host, settings.port)
    except OSError as e:
        print(f"gh-server: cannot listen on {settings.host}:{settings.port}: {e.strerror or e}"
              + (" (another process has it: stop it or pass --port)" if e.errno == errno.EADDRINUSE else ""),
              file=sys.stderr)
        return EXIT_USAGE
    try:
        app = create_app(settings)
    except Exception as e:  # a clear line for an operator, not a traceback, for the usual start-up failures
        sock.close()
        print(f"gh-server: cannot start: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_USAGE
    # No websocket pings from uvicorn (its defaults drop a silent runner after about 36 s): the
    # protocol's heartbeats and `dead_after` (45 s) are the one dead-peer bound, as documented. A live
    # viewer's socket gets its bounds in the protocol (gh_server/live/sockets.py).
    # No proxy headers here: the app believes only `trusted_proxies` (gh_server/app.py).
    config = uvicorn.Config(app, log_level=args.log_level, lifespan="on", ws=LiveBoundedWebSockets,
                            ws_ping_interval=None, ws_ping_timeout=None, timeout_keep_alive=HTTP_KEEP_ALIVE_S,
                            proxy_headers=False)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    return EXIT_OK if server.started else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
