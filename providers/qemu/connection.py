"""One libvirt connection that survives a libvirtd restart."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import libvirt
import structlog

from providers.base import ProviderError
from providers.qemu.errors import install_error_handler, is_connection_error, plain_reason

T = TypeVar("T")
log = structlog.get_logger("providers.qemu.connection")


class Connection:
    """Opens lazily, reopens when libvirtd went away, and retries a call once after reconnecting.

    Calls are blocking: callers run them through `errors.in_thread`. Domain handles are never cached
    across calls because a reconnect invalidates them; callers look domains up by name each time.
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._conn: libvirt.virConnect | None = None
        self._lock = threading.Lock()
        install_error_handler()

    def _open(self) -> libvirt.virConnect:
        with self._lock:
            if self._conn is not None:
                try:
                    if self._conn.isAlive():
                        return self._conn
                except libvirt.libvirtError:
                    pass
                try:
                    self._conn.close()
                except libvirt.libvirtError:
                    pass
                self._conn = None
                log.warning("libvirt connection lost, reconnecting", uri=self.uri)
            try:
                self._conn = libvirt.open(self.uri)
            except libvirt.libvirtError as e:
                raise ProviderError(f"cannot connect to libvirt at {self.uri}: {plain_reason(e)}") from None
            return self._conn

    def get(self) -> libvirt.virConnect:
        return self._open()

    def call(self, fn: Callable[[libvirt.virConnect], T]) -> T:
        """Run `fn(conn)`; if the connection broke underneath, reconnect and run it once more."""
        conn = self._open()
        try:
            return fn(conn)
        except libvirt.libvirtError as e:
            if not is_connection_error(e):
                raise
            with self._lock:
                if self._conn is not None and self._conn is conn:
                    try:
                        conn.close()
                    except libvirt.libvirtError:
                        pass
                    self._conn = None
            return fn(self._open())

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                except libvirt.libvirtError:
                    pass
                self._conn = None
