"""How scripts ran before gh-execd and the clock set in the first exec, for benches that measure both
side by side in one run.

`legacy(provider)` makes a provider set a restored guest's clock with qemu-ga's guest-set-time
(which runs `hwclock -w` in the guest), poll guest-exec-status from 20 ms (x1.5, at most 250 ms),
run scripts through the old wrapper (a private dir, the script copied in with `cat`, both streams
read with `head`, the dir removed before the exit), prime pooled machines with a ping only, and send
no script to gh-execd.
"""

from __future__ import annotations

from typing import Any

from providers.qemu import QemuMachine, QemuProvider
from providers.qemu.guest_agent import LEGACY_POLLING, ClockMode

OLD_WRAPPER = r"""
d=/tmp/gh-exec-$1; lim=$2; keep=$3
umask 077
mkdir "$d" || exit 125
cat > "$d/script" || exit 125
if command -v setsid >/dev/null 2>&1; then s=setsid; else s=; fi
$s /bin/sh "$d/script" > "$d/out" 2> "$d/err" < /dev/null &
echo $! > "$d/pid"
wait $!
rc=$?
head -c "$lim" "$d/out"
head -c "$lim" "$d/err" >&2
[ -n "$keep" ] || rm -rf "$d"
exit $rc
"""


def legacy(provider: QemuProvider) -> QemuProvider:
    provider.clock_mode = ClockMode.SET_TIME
    provider.polling = LEGACY_POLLING
    provider.prime_script = False
    provider.resident_exec = False
    create = provider._create_machine

    async def create_old(*args: Any, **kw: Any) -> QemuMachine:
        m = await create(*args, **kw)
        m.agent.wrapper = OLD_WRAPPER
        return m

    provider._create_machine = create_old  # type: ignore[method-assign]
    return provider
