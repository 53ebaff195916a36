"""One libvirt domain by name: the calls we make on it, each with its deadline and plain errors.

As Nova's `Guest` wraps a virDomain: callers say what they want (`state`, `suspend`, `save`...)
instead of looking the domain up and reading libvirt's error codes themselves. The domain is looked
up on every call, never cached: a reconnect (`connection.Connection`) invalidates virDomain handles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import libvirt

from providers.qemu.connection import Connection
from providers.qemu.errors import in_thread
from providers.qemu.hostcheck import SlowCall

T = TypeVar("T")

CALL_TIMEOUT = 60.0  # one libvirt call; generous because a loaded 2-core host is slow to start QEMU


def _gone(e: libvirt.libvirtError) -> bool:
    return e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN


class Domain:
    """The domain `name` on `conn`. Blocking methods end in `_blocking` (run them in a worker
    thread); the others run off the event loop and raise `ProviderError` (plain reason, or the
    deadline passed)."""

    def __init__(self, conn: Connection, name: str) -> None:
        self.conn = conn
        self.name = name

    # -- blocking: the one place a domain is looked up ----------------------------------------

    def call_blocking(self, fn: Callable[[libvirt.virConnect, libvirt.virDomain], T], *, retry: bool = True) -> T:
        """`fn(conn, dom)` on a fresh lookup; `retry=False` for calls that must not run twice
        (`Connection.call`). Raises libvirt.libvirtError."""
        return self.conn.call(lambda c: fn(c, c.lookupByName(self.name)), retry=retry)

    def _lookup(self, c: libvirt.virConnect) -> libvirt.virDomain | None:
        try:
            return c.lookupByName(self.name)
        except libvirt.libvirtError as e:
            if _gone(e):
                return None
            raise

    def lookup_blocking(self) -> libvirt.virDomain | None:
        """The virDomain, or None when there is no such domain."""
        return self.conn.call(self._lookup)

    def destroy_blocking(self, persistent: bool = False) -> None:
        """Stop it (and undefine it when `persistent`); quiet when it is gone already."""
        def go(c: libvirt.virConnect) -> None:
            dom = self._lookup(c)
            if dom is None:
                return
            try:
                dom.destroy()
            except libvirt.libvirtError as e:
                if e.get_error_code() not in (libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_OPERATION_INVALID):
                    raise
            if persistent:
                try:
                    dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
                                      | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE)
                except libvirt.libvirtError as e:
                    if not _gone(e):
                        raise

        self.conn.call(go)

    # -- async, each bounded ---------------------------------------------------------------------

    async def call(self, what: str, fn: Callable[[libvirt.virConnect, libvirt.virDomain], T], *,
                  timeout: float = CALL_TIMEOUT, retry: bool = True, slow: SlowCall | None = None) -> T:
        """`fn(conn, dom)` in a worker thread within `timeout`. Raises ProviderError."""
        return await in_thread(what, lambda: self.call_blocking(fn, retry=retry), timeout=timeout, slow=slow)

    async def exists(self) -> bool:
        """Raises ProviderError (libvirt failed or did not answer)."""
        return await in_thread("looking up machine", self.lookup_blocking, timeout=CALL_TIMEOUT) is not None

    async def state(self) -> int | None:
        """libvirt's VIR_DOMAIN_* state, or None when the domain is gone. Raises ProviderError."""
        def go(c: libvirt.virConnect) -> int | None:
            dom = self._lookup(c)
            if dom is None:
                return None
            try:
                return int(dom.state()[0])
            except libvirt.libvirtError as e:
                if _gone(e):  # it went between the lookup and the call
                    return None
                raise

        return await in_thread("reading machine state", lambda: self.conn.call(go), timeout=CALL_TIMEOUT,
                               slow=SlowCall.STATE)

    async def suspend(self, what: str = "pausing machine") -> None:
        """Raises ProviderError."""
        await self.call(what, lambda _c, dom: dom.suspend(), retry=False)

    async def resume(self, what: str = "resuming machine") -> None:
        """Raises ProviderError."""
        await self.call(what, lambda _c, dom: dom.resume(), retry=False)

    async def save(self, path: str, *, timeout: float) -> None:
        """Write its memory image to `path`; the domain ends. Raises ProviderError."""
        await self.call("saving machine memory", lambda _c, dom: dom.save(path), timeout=timeout, retry=False)

    async def destroy(self, persistent: bool = False) -> None:
        """Stop it; quiet when it is gone. Raises ProviderError."""
        await in_thread(f"destroying machine {self.name}", self.destroy_blocking, persistent, timeout=CALL_TIMEOUT)
