"""What OSWorld's snapshot had, where a check depends on it: lines put first in the imported setup.

OSWorld's tasks start from a snapshot of its Ubuntu VM and some checks assume its state without setting it:
"turn up to the max volume" checks the sink is at 100% and assumes the snapshot's was below it. Our start
states are not that snapshot (linux-desktop's sink is at 100%; GNOME's defaults differ from the snapshot's
settings), so a check would print True before the agent acts. A baseline sets what the snapshot is taken to
have, only for a task whose check reads it, so the untouched start is the one the task assumes.

Each baseline says what the snapshot is taken to have and why (the task's own words, or GNOME's default
where the task asks to change it). The lines never stop the setup (`|| :`): on a start state without the
tool, the check reads nothing either, and `gh-runner validate` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from gh_local.osworld.task import Task
from gh_osworld.names import VIDEO_TYPES


@dataclass(frozen=True)
class Baseline:
    reads: str  # the text in a check's command, or the type of a getter, that says it reads this state
    lines: tuple[str, ...]
    why: str  # what OSWorld's snapshot is taken to have, and why


BASELINES = (
    Baseline("pactl list sinks",
             ("pulseaudio --start >/dev/null 2>&1 || :",
              "pactl set-sink-volume @DEFAULT_SINK@ 50% >/dev/null 2>&1 || :",
              "pactl set-sink-mute @DEFAULT_SINK@ 0 >/dev/null 2>&1 || :"),
             "the sink below 100% (50%, unmuted): the task says the volume is too small"),
    Baseline("timedatectl status",
             ("sudo -n timedatectl set-timezone America/Los_Angeles >/dev/null 2>&1 || "
              "sudo -n ln -sf /usr/share/zoneinfo/America/Los_Angeles /etc/localtime >/dev/null 2>&1 || :",),
             "a time zone other than UTC (America/Los_Angeles, chosen here): the task asks to set UTC+0, and "
             "our images run in UTC"),
    Baseline("org.gnome.desktop.screensaver lock-enabled",
             ("gsettings set org.gnome.desktop.screensaver lock-enabled false >/dev/null 2>&1 || :",),
             "the screen lock off: the task asks to turn it on"),
    Baseline("org.gnome.desktop.session idle-delay",
             ("gsettings set org.gnome.desktop.session idle-delay 300 >/dev/null 2>&1 || :",),
             "GNOME's default idle delay (300 s): the task asks to turn dimming off (0)"),
    Baseline("org.gnome.desktop.interface text-scaling-factor",
             ("gsettings set org.gnome.desktop.interface text-scaling-factor 1.0 >/dev/null 2>&1 || :",),
             "GNOME's default text scale (1.0): the task asks to enlarge the text"),
    Baseline("org.gnome.desktop.notifications show-banners",
             ("gsettings set org.gnome.desktop.notifications show-banners true >/dev/null 2>&1 || :",),
             "banners shown (GNOME's default): the task asks for do-not-disturb"),
    # osworld-desktop carries Totem for this (image-builder/imagebuilder/osworld_desktop.py): xdg-mime skips a
    # default whose desktop file is missing and falls back to whichever player the system lists.
    Baseline("default_video_player",
             ("xdg-mime default org.gnome.Totem.desktop " + " ".join(f"video/{t}" for t in VIDEO_TYPES)
              + " >/dev/null 2>&1 || :",),
             "GNOME's Videos (Totem) as the default video player, Ubuntu's: the task asks to make it VLC"),
)


def _check_reads(task: Task) -> tuple[str, set[str]]:
    """The check's commands (one line, spaces collapsed) and its getters' types."""
    commands, getters = [], set()
    for call in task.evaluator.calls():
        for g in (call.result, call.expected):
            if g is None:
                continue
            getters.add(g.type)
            if g.type in ("vm_command_line", "vm_command_error"):
                cmd = g.params.get("command")
                commands.append(" ".join(cmd) if isinstance(cmd, list) else str(cmd))
    return " ".join(" ".join(commands).split()), getters


def baselines_for(task: Task) -> list[Baseline]:
    """The baselines the task's check reads."""
    commands, getters = _check_reads(task)
    return [b for b in BASELINES if b.reads in commands or b.reads in getters]
