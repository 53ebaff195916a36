"""This runner's machines by id, and the removal of what is left of the others.

A leftover is a domain, or a machine directory under `state_dir/machines/`, named for this runner
(`domain.domain_prefix`) whose ownership names this runner (the owner element of the domain's
metadata; `owner.json` in the directory once the domain is gone) and whose machine id is none of:
- the caller's `keep` (the daemon's attempts in flight);
- the provider's own machines, held here while they run (warm-snapshot builds, pooled machines);
- a machine whose destroy failed and is being retried in the background.

A destroy that fails (libvirtd restarting) is retried with a capped backoff until the domain is
gone, and only then are the machine's files removed: QEMU does not stop with libvirtd, and may
still be writing them. For the same reason a leftover domain that cannot be destroyed keeps its
files until a later reap.
"""

from __future__ import annotations

import asyncio
import errno
import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import libvirt
import structlog

from gh_common.backoff import Backoff
from providers.errors import ProviderError
from providers.qemu.connection import Connection
from providers.qemu.domain import Ownership, domain_prefix, ownership_from_domain_xml
from providers.qemu.errors import in_thread
from providers.qemu.handle import CALL_TIMEOUT, Domain

log = structlog.get_logger("providers.qemu")

OWNER_FILE = "owner.json"
DESTROY_RETRY_FIRST_S = 1.0  # a failed destroy is tried again after this, doubling up to the cap
DESTROY_RETRY_CAP_S = 30.0


def write_owner(mdir: Path, own: Ownership, domain: str) -> None:
    """The machine dir's owner.json (the reaper reads it when the domain is gone). Raises ProviderError."""
    try:
        (mdir / OWNER_FILE).write_text(json.dumps({"runner": own.runner, "machine_id": own.machine_id,
                                                   "domain": domain}))
    except OSError as e:
        full = " (the host disk is full)" if e.errno == errno.ENOSPC else ""
        raise ProviderError(f"cannot write the machine's files in {mdir}: {e.strerror or e}{full}") from e


class Reaper:
    """The machine ids of this process (in use, held, being destroyed) and the reaping of the rest."""

    def __init__(self, conn: Connection, runner_name: str, machines_dir: Path) -> None:
        self.conn = conn
        self.runner_name = runner_name
        self.machines_dir = machines_dir
        self._in_use: set[str] = set()  # machines of this process, made and not destroyed
        self._held: set[str] = set()  # the provider's own machines: never reaped while held
        self._retries: dict[str, asyncio.Task[None]] = {}  # destroys that failed, by machine id

    # -- this process's machines ----------------------------------------------------------------

    def in_use(self, machine_id: str) -> bool:
        return machine_id in self._in_use

    def track(self, machine_id: str) -> None:
        """A machine of this process was made with this id."""
        self._in_use.add(machine_id)

    def forget(self, machine_id: str) -> None:
        """The machine with this id is gone (destroyed, or reaped)."""
        self._in_use.discard(machine_id)

    def rename(self, old: str, new: str) -> None:
        """A machine now answers to `new` (a pooled machine handed to a lease): `old` is free, and
        no longer held."""
        self._in_use.discard(old)
        self._in_use.add(new)
        self._held.discard(old)

    def hold(self, machine_id: str) -> None:
        """Keep this machine from the reaper while it runs (the provider's own: a warm-snapshot
        build, a pooled machine) until `release`."""
        self._held.add(machine_id)

    def release(self, machine_id: str) -> None:
        self._held.discard(machine_id)

    # -- destroys that failed ---------------------------------------------------------------------

    def destroy_later(self, machine_id: str, domain: Domain, remove_files: Callable[[], Awaitable[None]],
                      reason: str) -> None:
        """Destroy `domain` in the background, with capped backoff, until it is gone; then call
        `remove_files`. The reaper leaves the machine to it meanwhile; `close` gives it up (the
        next process's reaper finds the domain and its files)."""
        if machine_id in self._retries:
            return
        log.warning("destroying machine failed; retrying in the background, its files are kept until the "
                    "domain is gone", machine_id=machine_id, reason=reason)
        task = asyncio.create_task(self._destroy_until_gone(machine_id, domain, remove_files),
                                   name=f"destroy-retry-{machine_id}")
        self._retries[machine_id] = task

        def forget(_t: asyncio.Task[None]) -> None:
            self._retries.pop(machine_id, None)

        task.add_done_callback(forget)

    def retrying(self) -> int:
        """How many machines' destroys are still being retried."""
        return len(self._retries)

    def pending_destroy(self, machine_id: str) -> asyncio.Task[None] | None:
        """The background destroy of `machine_id`, while it is being retried (to await its end)."""
        return self._retries.get(machine_id)

    async def _destroy_until_gone(self, machine_id: str, domain: Domain,
                                  remove_files: Callable[[], Awaitable[None]]) -> None:
        backoff = Backoff(base=DESTROY_RETRY_FIRST_S, cap=DESTROY_RETRY_CAP_S)
        tries = 1  # the destroy that failed
        while True:
            await asyncio.sleep(backoff.next_delay())
            tries += 1
            try:
                await domain.destroy()
            except ProviderError as e:
                log.info("destroy retry failed", machine_id=machine_id, tries=tries, next_in=backoff.ceiling(),
                         reason=str(e))
                continue
            await remove_files()
            log.warning("machine destroyed after retries; its files are removed", machine_id=machine_id,
                        tries=tries)
            return

    # -- leftovers ----------------------------------------------------------------------------------

    def _spared(self, machine_id: str, keep: set[str]) -> bool:
        return machine_id in keep or machine_id in self._held or machine_id in self._retries

    async def reap(self, keep: set[str]) -> list[str]:
        """Destroy this runner's domains and machine directories whose machine id is not in `keep`
        (nor held, nor being destroyed); the machine ids removed.

        Raises:
            ProviderError: libvirt could not list the domains (nothing is removed then).
        """
        prefix = domain_prefix(self.runner_name)

        def list_ours(c: libvirt.virConnect) -> list[tuple[str, Ownership | None, bool]]:
            out = []
            for dom in c.listAllDomains(0):
                n = dom.name()
                if not n.startswith(prefix):
                    continue
                try:
                    own = ownership_from_domain_xml(dom.XMLDesc(0))
                except libvirt.libvirtError:
                    continue
                out.append((n, own, bool(dom.isPersistent())))
            return out

        removed: list[str] = []
        found = await in_thread("listing machines", lambda: self.conn.call(list_ours), timeout=CALL_TIMEOUT)
        for name, own, persistent in found:
            if own is None or own.runner != self.runner_name or self._spared(own.machine_id, keep):
                continue
            try:
                await self.destroy_domain(name, persistent)
            except ProviderError as e:
                # Its files stay: QEMU may still run on them. The next reap tries again.
                log.warning("reaping a leftover machine failed; its files are kept", machine_id=own.machine_id,
                            reason=str(e))
                continue
            mdir = self.machines_dir / name
            await asyncio.to_thread(shutil.rmtree, mdir, True)
            self.forget(own.machine_id)
            removed.append(own.machine_id)
            log.warning("reaped leftover machine", machine_id=own.machine_id, domain=name)
        live = {n for n, _, _ in found}
        if self.machines_dir.is_dir():
            for mdir in sorted(self.machines_dir.iterdir()):
                if not mdir.name.startswith(prefix) or mdir.name in live:
                    continue
                try:
                    info = json.loads((mdir / OWNER_FILE).read_text())
                    mid = str(info.get("machine_id"))
                    if info.get("runner") != self.runner_name:
                        continue
                except (OSError, ValueError):
                    mid = mdir.name
                if self._spared(mid, keep):
                    continue
                await asyncio.to_thread(shutil.rmtree, mdir, True)
                if mid not in removed:
                    removed.append(mid)
                log.warning("reaped leftover machine files", machine_id=mid, dir=str(mdir))
        return removed

    async def destroy_domain(self, name: str, persistent: bool = False) -> None:
        """Stop the domain `name` (undefine it when `persistent`); quiet when it is gone. Raises ProviderError."""
        await Domain(self.conn, name).destroy(persistent)

    def close(self) -> None:
        """Give up the destroys still being retried: the next process's reaper finds what they leave."""
        for task in list(self._retries.values()):
            task.cancel()


__all__ = ["DESTROY_RETRY_CAP_S", "DESTROY_RETRY_FIRST_S", "OWNER_FILE", "Reaper", "write_owner"]
