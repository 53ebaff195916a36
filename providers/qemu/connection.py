"""One libvirt connection, shared by every worker thread, that survives a libvirtd restart."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import libvirt
import structlog

from providers.errors import ProviderError
from providers.qemu.errors import install_error_handler, plain_reason

T = TypeVar("T")
log = structlog.get_logger("providers.qemu.connection")


def _alive(conn: libvirt.virConnect) -> bool:
    try:
        return bool(conn.isAlive())
    except Exception:  # a closed python wrapper raises on its None handle
        return False


def _never_sent(e: libvirt.libvirtError) -> bool:
    # libvirt's RPC client writes a whole request before it reads; when the write fails, the daemon
    # at most saw part of a message, which it drops. Such a call is safe to run again.
    return (e.get_error_message() or "").startswith("Cannot write data")


class Connection:
    """Opens lazily and reopens when libvirtd went away.

    Calls are blocking: callers run them through `errors.in_thread`, so several threads use the
    connection at once. A broken connection is therefore dropped, never closed: closing frees the
    handle under the calls other threads have in flight on it (libvirt then reports "invalid
    connection pointer" or uses freed memory). The python wrapper closes it once the last of those
    calls lets go. Whether the connection broke is asked of libvirt (`isAlive`), not guessed from an
    error's text: a guest agent that is "not connected" yet is a normal answer while a guest boots.

    Domain handles are never cached across calls because a reconnect invalidates them; callers look
    domains up by name each time.
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._conn: libvirt.virConnect | None = None
        self._lock = threading.Lock()
        install_error_handler()

    def _open(self) -> libvirt.virConnect:
        with self._lock:
            if self._conn is not None:
                if _alive(self._conn):
                    return self._conn
                self._conn = None
                log.warning("libvirt connection lost, reconnecting", uri=self.uri)
            try:
                self._conn = libvirt.open(self.uri)
            except libvirt.libvirtError as e:
                raise ProviderError(f"cannot connect to libvirt at {self.uri}: {plain_reason(e)}") from None
            return self._conn

    def _drop(self, conn: libvirt.virConnect) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None

    def get(self) -> libvirt.virConnect:
        return self._open()

    def call(self, fn: Callable[[libvirt.virConnect], T], *, retry: bool = True) -> T:
        """Run `fn(conn)`; if the connection broke underneath, reconnect and, when `retry`, run it once more.

        Pass `retry=False` for calls that must not run twice (starting or restoring a domain): the
        first may have reached libvirtd before the connection broke. Those are still retried when the
        request provably never left (the write failed, as on the first call after libvirtd restarted).
        """
        conn = self._open()
        try:
            return fn(conn)
        except libvirt.libvirtError as e:
            if _alive(conn):
                raise
            self._drop(conn)
            retry = retry or _never_sent(e)
            log.warning("libvirt connection lost during a call", uri=self.uri, reason=plain_reason(e),
                        retried=retry)
            if not retry:
                raise
            return fn(self._open())

    def close(self) -> None:
        """Close at shutdown, when no call is in flight any more."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except libvirt.libvirtError:
                pass
