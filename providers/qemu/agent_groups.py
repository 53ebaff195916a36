"""Agent execs in cgroups of their own, so a takeover's hold can freeze them (docs/security.md, "Takeovers").

Every exec an agent starts (gh_runner/machine_requests.py, `Machine.run_agent_script`) runs in a
cgroup v2 group of its own, `/sys/fs/cgroup/gh-agent/x<token>`. A process's children are born in its
cgroup and stay there whatever they do to their session or process group (setsid, a double fork, a
daemon), so the group holds the exec and everything it started. A hold freezes the parent,
`gh-agent` (`cgroup.freeze`, which the kernel applies to every group below it), and the hand-back
thaws it: the running exec, the processes it left behind, and any exec that joins while the hold is on.

Who joins: the shell that runs the agent's script moves itself in before the script's first line
(`join`: on gh-execd, whose daemon forks the interpreter directly), or the qemu-ga wrapper does it
as root before it starts the script, as another user where the image says so (guest_agent.WRAPPER's
$8: a desktop's user cannot write under /sys/fs/cgroup). Both use the same text.

A frozen exec's time is not its own: its timeout moves on by every second of the hold, in the guest
(gh-execd reads HELD_FILE, which the freeze script keeps) and on the host (`FrozenTime`, which moves the
host's bounds on the exec's reply). qemu-ga's path has no guest-side deadline: the host kills the
script when its bound passes.

A guest whose cgroup2 is not mounted (linux-tiny built before its rcS mounted it) gets it mounted by
the first join or freeze: both run as root. A join that fails leaves the script running outside any
group (unfrozen by a hold): the script is never refused for it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

CGROUP_ROOT = "/sys/fs/cgroup"
AGENT_GROUP = f"{CGROUP_ROOT}/gh-agent"
# The freeze waits for the kernel to report the whole group frozen (`cgroup.events`): a task in a
# system call is frozen when it leaves it. Bounded: 100 looks 50 ms apart.
SETTLE_LOOKS = 100
SETTLE_EXIT = 4  # the freeze script's exit when the group did not settle within its looks
# "<centiseconds held in all> <uptime in centiseconds when the current freeze began, or 0>": the guest's
# record of how long the groups stood frozen since boot, read by gh-execd at a script's deadline.
HELD_FILE = "/run/gh-agent.held"


def new_group() -> str:
    """A fresh exec group's name under AGENT_GROUP (host-chosen, so the host can name it)."""
    return "x" + secrets.token_hex(6)


def join(group: str) -> str:
    """sh text, on one line ending in "; ", that moves the shell running it (and so every process it
    starts from then on) into the exec group `group`. Silent: a failure leaves the shell where it was.
    One line, so prepended to a script it keeps the script's line numbers."""
    if not group.isalnum():
        raise ValueError(f"not an exec group name: {group!r}")
    d = f"{AGENT_GROUP}/{group}"
    return (f"{{ [ -e {CGROUP_ROOT}/cgroup.controllers ] || mount -t cgroup2 cgroup2 {CGROUP_ROOT}; "
            f"mkdir -p {d} && echo $$ > {d}/cgroup.procs; }} 2>/dev/null; ")


def joined(script: str, group: str) -> str:
    """The agent's script, run in `group` from its first line."""
    return join(group) + script


def freeze_script(frozen: bool) -> str:
    """sh (root) that freezes or thaws every agent exec group and returns once the kernel says it is
    done. The parent is made when missing, so an exec that starts during a hold is frozen as it joins."""
    v = 1 if frozen else 0
    # HELD_FILE: a freeze notes when it began before it freezes; a thaw adds the hold to the total after
    # it thaws (uptime's "s.cc" read as centiseconds; "1cc - 100" keeps a leading 0 from reading as octal).
    held = (
        f"h={HELD_FILE}; read up _ < /proc/uptime; now=$(( ${{up%.*}} * 100 + 1${{up#*.}} - 100 ))\n"
        "set -- $(cat $h 2>/dev/null); t=${1:-0}; s=${2:-0}\n"
    )
    note = ('[ "$s" != 0 ] || { mkdir -p /run; echo "$t $now" > $h; }\n' if frozen else
            '[ "$s" = 0 ] || { [ "$now" -ge "$s" ] || s=$now; echo "$(( t + now - s )) 0" > $h; }\n')
    return (
        f"c={CGROUP_ROOT}; g={AGENT_GROUP}\n"
        "[ -e $c/cgroup.controllers ] || mount -t cgroup2 cgroup2 $c || exit 3\n"
        "[ -d $g ] || mkdir $g || exit 3\n"
        + held + (note if frozen else "")
        + f"echo {v} > $g/cgroup.freeze || exit 3\n"
        "i=0\n"
        f"until grep -q '^frozen {v}$' $g/cgroup.events; do\n"
        f"  i=$((i + 1)); [ $i -le {SETTLE_LOOKS} ] || exit {SETTLE_EXIT}\n"
        "  sleep 0.05\n"
        "done\n"
        + ("" if frozen else held + note)
    )


class FrozenTime:
    """The host's count of the seconds a machine's agent execs stood frozen (a freeze to its thaw), so
    the host's bounds on an exec in flight move on by its hold as gh-execd's deadline does."""

    def __init__(self) -> None:
        self._total = 0.0
        self._since: float | None = None

    def froze(self) -> None:
        if self._since is None:
            self._since = time.monotonic()

    def thawed(self) -> None:
        if self._since is not None:
            self._total += time.monotonic() - self._since
            self._since = None

    def seconds(self) -> float:
        return self._total + (time.monotonic() - self._since if self._since is not None else 0.0)

    def deadline(self, timeout: float) -> Callable[[], float]:
        """A monotonic deadline `timeout` seconds from now, moved on by every second frozen meanwhile."""
        at, before = time.monotonic() + timeout, self.seconds()
        return lambda: at + self.seconds() - before


__all__ = ["AGENT_GROUP", "HELD_FILE", "FrozenTime", "freeze_script", "join", "joined", "new_group"]
