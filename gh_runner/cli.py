"""The `gh-runner` command line: every subcommand is parsed here. The runner's own are run here: the daemon
(bare form), `images`, `doctor` and `selftest`. `local`, `validate` and `import` play both halves, so they
live in gh_local, whose entry point (gh_local/cli.py, the installed `gh-runner`) passes them in."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gh_common.timeouts import within
from gh_runner import __version__
from gh_runner.config import CREDENTIAL_NAME, SERVICE_DIR, ConfigError, RunnerConfig, load_config
from gh_wire.protocol import PROTOCOL_VERSION
from providers.qemu.pool import KEEP_LEASED_S

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

DESCRIPTION = """\
gh-runner runs eval attempts on this host. It dials out to a GuidingHand control plane over a
websocket (no inbound ports), advertises its images and slots, and for every attempt it is leased
it makes a fresh copy-on-write VM, runs the case's setup and check scripts inside it, relays the
agent's screen/input/exec, and reports the result.

  gh-runner --server wss://evals.example.com --token gh_rn_... --labels lab,lenovo --slots 4

Subcommands (each has its own --help, listing only its own options):
  images              list the images and start-state versions this runner would advertise
  doctor              check this host and this configuration, and say how to fix what is wrong
  selftest            prove each image end to end on real machines, every step timed
  drain [--migrate]   drain the runner of this state dir (--migrate: its attempts go on elsewhere)
  local CASES.yaml    run cases on this host with an embedded control plane; the results page
  validate CASES.yaml check each case is worth scoring: noop fails, reference passes, every time
  import osworld PATH turn OSWorld-format tasks into a cases file, saying which cannot be and why
  export REPORT       a run's trajectories as Harbor's ATIF or OSWorld's result layout (or --run ID)
"""

EPILOG = f"""\
configuration:
  Every option can also come from a YAML file (--config FILE; keys like `slots`, `images_dir`) and
  from the environment as GH_RUNNER_<OPTION> (GH_RUNNER_SLOTS=4, GH_RUNNER_IMAGES_DIR=...).
  Precedence: flags > environment > config file > defaults. Unknown keys are refused.

the runner token (never printed or logged):
  --token, GH_RUNNER_TOKEN, --token-file FILE, `token_file:` in the config file, or the systemd
  credential `{CREDENTIAL_NAME}` (LoadCredential={CREDENTIAL_NAME}:/etc/gh-runner/token).

default directories:
  root, or when {SERVICE_DIR} exists and is writable (the packaged service user):
  {SERVICE_DIR}/images and {SERVICE_DIR}/state; otherwise
  $XDG_DATA_HOME/gh-runner/images and $XDG_STATE_HOME/gh-runner (~/.local/...). libvirt's
  qemu:///system must be able to traverse them (not under /root).

signals and exit codes:
  SIGTERM/SIGINT drains: no new leases, running attempts get --drain-grace seconds, then are
  cancelled and reported as errors. A second signal forces. Exit 0 after a clean drain, 1 on a
  forced stop or failure, 2 on bad usage or configuration (a token the server refuses, when
  started by hand on a terminal: see --on-token-refused).

version {__version__}, runner protocol {PROTOCOL_VERSION}.
"""

# Options that map 1:1 onto RunnerConfig keys (dest == key).
CONFIG_KEYS = ("server", "token", "token_file", "name", "labels", "slots", "images_dir", "state_dir",
               "libvirt_uri", "metrics_listen", "log_format", "log_level", "drain_grace", "insecure",
               "on_token_refused")


_DEFAULT_DIRS = (f"as root or the service user {SERVICE_DIR}/{{}}, otherwise "
                 "$XDG_{}_HOME/gh-runner{} (~/.local/{}/gh-runner{})")
IMAGES_DIR_HELP = "where images live; default " + _DEFAULT_DIRS.format("images", "DATA", "/images", "share", "/images")
STATE_DIR_HELP = ("journal, overlays and start-state versions; default "
                  + _DEFAULT_DIRS.format("state", "STATE", "", "state", ""))


def _machine_options() -> argparse.ArgumentParser:
    """The options every command that makes machines on this host takes (the daemon, images, doctor,
    selftest, local, validate)."""
    # SUPPRESS: an option not typed is absent, so env and file values are not overridden by defaults
    # and the options may be given before or after the subcommand.
    p = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    g = p.add_argument_group("host options")
    g.add_argument("--config", metavar="FILE", type=Path, help="YAML config file (GH_RUNNER_CONFIG)")
    g.add_argument("--images-dir", dest="images_dir", metavar="DIR", help=IMAGES_DIR_HELP)
    g.add_argument("--state-dir", dest="state_dir", metavar="DIR", help=STATE_DIR_HELP)
    g.add_argument("--libvirt-uri", dest="libvirt_uri", metavar="URI", help="default qemu:///system")
    g.add_argument("--log-format", dest="log_format", choices=("json", "console"),
                   help="json lines (journald, log shippers) or console text; default console")
    g.add_argument("--log-level", dest="log_level", choices=("debug", "info", "warning", "error"),
                   help="default info")
    return p


def _daemon_options() -> argparse.ArgumentParser:
    """The daemon's own options: how it reaches the control plane and what it offers there. Only the
    bare form and `doctor` (which checks this configuration) take them."""
    p = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    g = p.add_argument_group("daemon options")
    g.add_argument("--server", metavar="URL", action="append",
                   help="control plane, e.g. wss://evals.example.com (https:// works too; ws:// only to "
                        "loopback unless --insecure); several gh-server processes: repeat it or separate "
                        "URLs with commas, and a lost server's runner moves to the next")
    g.add_argument("--token", metavar="gh_rn_...", help="runner token (prefer GH_RUNNER_TOKEN or --token-file: "
                                                        "flags show up in `ps`)")
    g.add_argument("--token-file", dest="token_file", metavar="FILE", help="file holding the runner token")
    g.add_argument("--name", help="how this runner appears in the control plane; default: hostname")
    g.add_argument("--labels", metavar="A,B", help="comma-separated labels runs can ask for, e.g. lab,lenovo")
    g.add_argument("--slots", type=int, metavar="N", help="attempts at once (one VM each); default 1")
    g.add_argument("--metrics-listen", dest="metrics_listen", metavar="HOST:PORT",
                   help="serve Prometheus metrics here (a bare port binds loopback); default off")
    g.add_argument("--drain-grace", dest="drain_grace", type=float, metavar="SECONDS",
                   help="on SIGTERM, how long running attempts may take to finish; default 600")
    g.add_argument("--on-token-refused", dest="on_token_refused", choices=("auto", "exit", "retry"),
                   help="when the server refuses the token: exit 2, or retry every 10 minutes; default auto: exit "
                        "when started by hand on a terminal, retry under systemd or without a terminal")
    g.add_argument("--insecure", action="store_true",
                   help="allow ws:// (cleartext, token visible on the wire) to a non-loopback server")
    g.add_argument("--pool-keep", dest="pool_keep", metavar="IMAGE,...",
                   help="images the hot pool keeps ready from the start (pool.keep); others only once leased")
    g.add_argument("--pool-keep-leased-s", dest="pool_keep_leased_s", type=float, metavar="SECONDS",
                   help=f"a source leased here stays hot this long after its last lease; default {KEEP_LEASED_S:g}")
    return p


def build_parser() -> argparse.ArgumentParser:
    machine, daemon = _machine_options(), _daemon_options()
    parser = argparse.ArgumentParser(
        prog="gh-runner", description=DESCRIPTION, epilog=EPILOG, parents=[machine, daemon],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"gh-runner {__version__} (protocol {PROTOCOL_VERSION})")
    sub = parser.add_subparsers(dest="command",
                                metavar="{images,doctor,selftest,drain,local,validate,import,export}")
    images = sub.add_parser("images", parents=[_machine_options()], help="list the images this runner would advertise",
                            description="List images (name, os, version, checksum) and held start-state versions.")
    images.add_argument("--json", action="store_true", help="machine-readable output")
    # No `choices`: a stray value of an unknown option is not taken for a bad action (the error names
    # the option); main() checks the action.
    images.add_argument("action", nargs="?", default=None, metavar="{push,pull}",
                        help="push NAME: the image to the configured registry; pull REF (HOST/REPO:TAG, or a "
                             "name): an image from it into --images-dir, verified")
    images.add_argument("target", nargs="?", default=None, metavar="NAME|REF")
    sub.add_parser("doctor", parents=[_machine_options(), _daemon_options()],
                   help="check this host and this configuration, and say how to fix what is wrong",
                   description="Check libvirt, KVM (or the TCG fallback), images, disk space and permissions, and the "
                               "daemon's configuration (server, token): it takes the daemon's options to check them.")
    local = sub.add_parser(
        "local", parents=[_machine_options()],
        help="run cases on this host with an embedded control plane",
        description="Run the cases of CASES (YAML or JSON: `cases:`, optional `agents:` and `repeat:`) on this "
                    "host, print the results table and write a JSON report and the results page. Exit 0 when every "
                    "try was scored, 1 when any try ended in error (the report is still written), 2 on a usage or "
                    "configuration error; Ctrl-C writes a partial report of the finished tries.")
    local.add_argument("cases", metavar="CASES", type=Path, help="cases file (YAML or JSON)")
    local.add_argument("--agents", default=None, help="comma-separated agents, e.g. noop,reference")
    local.add_argument("--repeat", type=int, default=None, metavar="N", help="tries per case and agent")
    local.add_argument("--report", type=Path, default=None, metavar="FILE",
                       help="where to write the JSON report (replays go beside it, in RUN_ID-replays/)")
    local.add_argument("--slots", type=int, default=None, metavar="N",
                       help="attempts at once on this host (default: the --config file's slots, else 2)")
    local.add_argument("--server-config", type=Path, default=None, metavar="FILE",
                       help="settings for the embedded control plane, in gh-server's --config format: `agents` "
                            "(your own command or HTTP agents), `judge`, `customer_model`")
    selftest = sub.add_parser(
        "selftest", parents=[_machine_options()],
        help="make real machines from each image and check every step a run needs",
        description="For each image (default: all it would advertise) make real machines and check, step by "
                    "step with a time each: cold start and guest channel, a per-user setting as the signed-in "
                    "user (elevated), the verdict reader, the check's environment, screenshot, typing, click, "
                    "memory save and warm start, and that the destroyed machines left nothing. Exit 0 only "
                    "when every step passed.")
    selftest.add_argument("--image", action="append", default=None, metavar="NAME",
                          help="test this image (repeat for more); default: every image")
    selftest.add_argument("--json", type=Path, default=None, metavar="FILE",
                          help="write the report: one {image, step, ok, seconds, detail} per step")
    selftest.add_argument("--name", default=argparse.SUPPRESS,
                          help="runner name; its machines are named <name>-selftest")
    validate = sub.add_parser(
        "validate", parents=[_machine_options()],
        help="check that each case is valid: noop fails, reference passes, the setup is deterministic",
        description="Run the cases of CASES against noop and reference, N tries each on fresh machines, and "
                    "say per case valid, broken, flaky or unvalidated, with the reasons. Exit 0 when every try "
                    "ran; with --strict, 3 when a case is not valid.")
    validate.add_argument("cases", metavar="CASES", type=Path, help="cases file (YAML or JSON)")
    validate.add_argument("--repeat", type=int, default=None, metavar="N", help="tries per case and agent (3)")
    validate.add_argument("--report", type=Path, default=None, metavar="FILE", help="where to write the JSON report")
    validate.add_argument("--slots", type=int, default=None, metavar="N", help="attempts at once on this host")
    validate.add_argument("--strict", action="store_true", help="exit 3 when a case is not valid")
    drain = sub.add_parser(
        "drain", parents=[_machine_options()], help="stop the runner of this state dir, its attempts drained",
        description="Signal the runner daemon of this state dir (its pid file) to drain: no new leases, its "
                    "attempts get --drain-grace to finish. With --migrate, each attempt in its task is first "
                    "saved (a save point, pushed to the runner's registry) and goes on on another runner of the "
                    "control plane, the same try (docs/start-states.md, \"Resume\"). Returns at once; the daemon "
                    "exits when drained.")
    drain.add_argument("--migrate", action="store_true",
                       help="hand each attempt in its task to another runner instead of waiting for it")
    export = sub.add_parser(
        "export", help="a run's trajectories in Harbor's ATIF or OSWorld's result layout",
        description="Write a run's trajectories (each attempt's steps, words, actions, screenshots, tokens, cost, "
                    "score; redacted as its replay is) into DIR: from a `gh-runner local` report, or from a "
                    "gh-server with --run ID (--server URL, the API key in EAGER_API_KEY).")
    export.add_argument("source", nargs="?", type=Path, default=None, metavar="REPORT",
                        help="a `gh-runner local` report.json, or its directory")
    export.add_argument("--run", default=None, metavar="ID", help="a test run on a gh-server, instead of REPORT")
    export.add_argument("--server", default=None, metavar="URL", help="the gh-server for --run (or GH_SERVER_URL)")
    export.add_argument("--format", required=True, choices=("atif", "osworld"), help="the output format")
    export.add_argument("--out", required=True, type=Path, metavar="DIR", help="where to write it")
    imp = sub.add_parser("import", help="turn a benchmark's tasks into a cases file",
                         description="Turn a benchmark's tasks into a cases file in the API's shape.")
    benchmarks = imp.add_subparsers(dest="benchmark", metavar="{osworld}", required=True)
    osworld = benchmarks.add_parser(
        "osworld", help="OSWorld-format tasks (docs/osworld.md)",
        description="Read OSWorld-format tasks (task files, directories, or a test_all.json index with its "
                    "examples/ directory) and write a cases file: per task `imported` or `skipped: REASON`, "
                    "with totals. Exit 0 when the file is written, 1 when no task could be imported, 2 on bad "
                    "input (nothing is written then).")
    osworld.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="task file, directory or index")
    osworld.add_argument("--out", type=Path, default=Path("cases.yaml"), metavar="FILE",
                         help="the cases file to write (default: cases.yaml)")
    osworld.add_argument("--start-state", default="osworld-desktop", metavar="NAME",
                         help="the start state of every case (default: osworld-desktop, whose checks run "
                              "gh_osworld in the guest; linux-desktop and linux-tiny get checks in sh)")
    osworld.add_argument("--files-dir", type=Path, default=None, metavar="DIR",
                         help="where downloaded task files are kept, by content as DIR/sha256/<hex> (default: "
                              "osworld-files beside --out)")
    osworld.add_argument("--like", default=None, metavar="NAME",
                         help="the start state offers what NAME offers (osworld-desktop, linux-desktop, linux-tiny): "
                              "an image of your own built from one of their profiles")
    osworld.add_argument("--fetch-only", action="store_true",
                         help="fetch every file the tasks need into --files-dir and write no cases")
    osworld.add_argument("--offline", action="store_true",
                         help="never reach the network: read files from --files-dir only")
    return parser


def _config_from(args: argparse.Namespace) -> RunnerConfig:
    flags = {k: getattr(args, k) for k in CONFIG_KEYS if hasattr(args, k)}
    pool = {k: getattr(args, f"pool_{k}") for k in ("keep", "keep_leased_s") if hasattr(args, f"pool_{k}")}
    if pool:
        flags["pool"] = pool
    return load_config(flags, os.environ, getattr(args, "config", None))


def _drain(state_dir: Path, migrate: bool) -> int:
    """Signal the daemon whose pid file is in `state_dir`: SIGUSR1 to migrate, else SIGTERM."""
    from gh_runner.daemon import PID_FILE

    pid_file = state_dir / PID_FILE
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError) as e:
        return _fail(f"no runner daemon found for {state_dir} ({pid_file}: {e}); is it running with this "
                     "--state-dir?", EXIT_FAILED)
    try:
        os.kill(pid, signal.SIGUSR1 if migrate else signal.SIGTERM)
    except ProcessLookupError:
        return _fail(f"the runner daemon of {state_dir} (pid {pid}) is not running", EXIT_FAILED)
    except PermissionError:
        return _fail(f"not allowed to signal the runner daemon (pid {pid}): run as its user or root", EXIT_FAILED)
    print(f"gh-runner (pid {pid}) is draining{': attempts in their task go on on other runners' if migrate else ''}")
    return 0


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    print(f"gh-runner: {message}", file=sys.stderr)
    return code


# A command this package parses but does not run itself: `local` and `validate` play both halves (an
# embedded gh-server and a runner), so they live above both, in gh_local, which passes them in here.
Command = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None, commands: Mapping[str, Command] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = _config_from(args)
    except ConfigError as e:
        return _fail(str(e))
    from gh_runner.log import configure_logging, redactor

    # Logs go to stderr for every command, so stdout stays clean for output (images --json).
    configure_logging(config.log_format, config.log_level)
    if config.token is not None:
        redactor.add(config.token.get_secret_value())
    command = getattr(args, "command", None)
    if command == "drain":
        return _drain(config.state_dir, bool(args.migrate))
    if command == "images":
        if getattr(args, "action", None) is not None:
            if args.action not in ("push", "pull"):
                return _fail(f"images: unknown action {args.action!r}; use `images push NAME` or `images pull REF`")
            if not args.target:
                return _fail(f"images {args.action} needs {'NAME' if args.action == 'push' else 'REF'}")
            from gh_runner import imagemove

            return imagemove.main(config, args.action, args.target)
        return _images(config, bool(getattr(args, "json", False)))
    if command == "doctor":
        from gh_runner import doctor

        return int(doctor.main(config) or 0)
    if command == "import":
        run = (commands or {}).get(f"import {args.benchmark}")
        if run is None:
            return _fail(f"`gh-runner import {args.benchmark}` is not available in this build (start it as "
                         "gh_local.cli)", EXIT_FAILED)
        return int(run(args) or 0)
    if command == "export":
        run = (commands or {}).get("export")
        if run is None:
            return _fail("`gh-runner export` is not available in this build (start it as gh_local.cli)", EXIT_FAILED)
        return int(run(args) or 0)
    if command in ("local", "validate"):
        # Resolved like the daemon's (flags > env > file > defaults); the whole config rides along. The state
        # dir only where one was given (flag, env or file): without one, local's runner keeps its state in a
        # temporary dir of its own, never in the default one a daemon on this host may be using.
        args.images_dir, args.libvirt_uri = config.images_dir, config.libvirt_uri
        args.state_dir = config.state_dir if "state_dir" in config.model_fields_set else None
        args.runner_config = config
        run = (commands or {}).get(command)
        if run is None:
            return _fail(f"`gh-runner {command}` is not available in this build (start it as gh_local.cli)",
                         EXIT_FAILED)
        return int(run(args) or 0)
    if command == "selftest":
        from gh_runner import selftest

        args.runner_config = config
        return int(selftest.main(args) or 0)
    return run_daemon(config)


def _images(config: RunnerConfig, as_json: bool) -> int:
    from gh_runner.provider_factory import make_provider

    if not config.images_dir.is_dir():  # a typo in --images-dir is a configuration error, not "no images"
        return _fail(f"images dir {config.images_dir} does not exist (build an image into it with "
                     f"`image-builder/build linux-tiny --out {config.images_dir}`, or pass --images-dir)")

    async def collect() -> tuple[list[Any], list[tuple[str, int]]]:
        provider = make_provider(config)
        try:
            return await within(120, provider.list_images()), await within(120, provider.held_versions())
        finally:
            await provider.close()

    try:
        images, held = asyncio.run(collect())
    except Exception as e:
        return _fail(f"cannot list images in {config.images_dir}: {e}", EXIT_FAILED)
    if as_json:
        print(json.dumps({
            "images_dir": str(config.images_dir),
            "images": [{"name": i.name, "os": i.os, "version": i.version, "checksum": i.checksum} for i in images],
            "start_states": [{"start_state_id": s, "version": v} for s, v in held],
        }, indent=2))
        return EXIT_OK
    if not images:
        print(f"no images in {config.images_dir} (build one with image-builder, or pass --images-dir)")
    else:
        rows = [("NAME", "OS", "VERSION", "CHECKSUM")] + [(i.name, i.os, i.version, i.checksum) for i in images]
        widths = [max(len(r[c]) for r in rows) for c in range(3)]
        for r in rows:
            print(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}")
    if held:
        print()
        print("start-state versions held: " + ", ".join(f"{s} v{v}" for s, v in held))
    return EXIT_OK


def _observers(config: RunnerConfig) -> list[Any]:
    """Daemon observers for sd_notify and metrics (gh_runner/observers.py)."""
    from gh_runner import observers

    return list(observers.make_observers(config))


def run_daemon(config: RunnerConfig) -> int:
    from gh_runner.daemon import Daemon
    from gh_runner.log import get_logger
    from gh_runner.names import remembered_name
    from gh_runner.provider_factory import make_provider

    try:
        config.connect_url()
        config.check_transport()
        config.token_value()
    except ConfigError as e:
        return _fail(str(e))
    log = get_logger()
    # A runner not given a name is called by its hostname until it learns the name it was registered
    # with (the welcome says it); from then on it is called that, in its logs and its machines' names.
    adopt = config.name == socket.gethostname()
    if adopt and (known := remembered_name(config.state_dir)):
        config = config.model_copy(update={"name": known})

    async def go(config: RunnerConfig) -> tuple[int, str | None]:
        try:
            provider = make_provider(config)
        except Exception as e:
            log.error("cannot set up the machine provider; run `gh-runner doctor`", error=f"{type(e).__name__}: {e}")
            return EXIT_FAILED, None
        daemon = Daemon(config, provider, observers=_observers(config), adopt_registered_name=adopt)
        daemon.install_signal_handlers()
        code = await daemon.run()
        return code, daemon.restart_as or None

    try:
        while True:
            code, rename = asyncio.run(go(config))
            if not rename or code != EXIT_OK:
                return code
            config = config.model_copy(update={"name": rename})
    except KeyboardInterrupt:  # only before the signal handlers are installed
        return EXIT_FAILED
    except OSError as e:
        log.error("runner failed", error=f"{type(e).__name__}: {e}")
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
