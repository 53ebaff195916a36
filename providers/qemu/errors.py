"""libvirt errors as plain reasons, and blocking libvirt calls run off the event loop with a deadline."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import libvirt

from providers.errors import ProviderError
from providers.qemu.hostcheck import SlowCall, slow_hypervisor

T = TypeVar("T")

_handler_lock = threading.Lock()
_handler_installed = False


def _swallow(_ctx: object, _err: object) -> None:
    # libvirt-python prints every error to stderr unless a handler is registered; the error still
    # raises as libvirtError in the caller, which turns it into a ProviderError with a plain reason.
    return None


def install_error_handler() -> None:
    """Silence libvirt's default stderr printing (once per process)."""
    global _handler_installed
    with _handler_lock:
        if not _handler_installed:
            libvirt.registerErrorHandler(_swallow, None)
            _handler_installed = True


# libvirt messages embed long internal prefixes; these cover what operators actually hit.
_PLAIN: list[tuple[int, str]] = [
    (libvirt.VIR_ERR_NO_DOMAIN, "the machine does not exist (it was destroyed or never started)"),
    (libvirt.VIR_ERR_OPERATION_INVALID, "the machine is not in a state that allows this"),
    (libvirt.VIR_ERR_AGENT_UNRESPONSIVE, "the guest agent is not answering"),
    (libvirt.VIR_ERR_AGENT_UNSYNCED, "the guest agent is not answering"),
    (libvirt.VIR_ERR_OPERATION_TIMEOUT, "the hypervisor did not answer in time"),
    (libvirt.VIR_ERR_NO_CONNECT, "cannot reach libvirt"),
]

_STRIP = re.compile(r"^(internal error|operation failed|Requested operation is not valid|error from service):\s*", re.I)


def plain_reason(e: BaseException) -> str:
    """A short, operator-readable reason for a libvirt error (no codes, no internal prefixes)."""
    if isinstance(e, libvirt.libvirtError):
        code = e.get_error_code()
        msg = (e.get_error_message() or str(e) or "").strip()
        msg = _STRIP.sub("", msg)
        for c, text in _PLAIN:
            if code == c:
                return f"{text}: {msg}" if msg and c != libvirt.VIR_ERR_NO_DOMAIN else text
        if "Permission denied" in msg and "storage file" in msg:
            return (f"{msg} (QEMU runs as libvirt-qemu: keep images and state under a directory it can traverse, "
                    "e.g. /var/lib/gh-runner)")
        if code == libvirt.VIR_ERR_SYSTEM_ERROR and "Failed to connect socket" in msg:
            return f"cannot reach libvirt ({msg}); is libvirtd running?"
        return msg or "libvirt error"
    return str(e) or e.__class__.__name__


async def in_thread(what: str, fn: Callable[..., T], *args: Any, timeout: float, slow: SlowCall | None = None) -> T:
    """Run a blocking libvirt call in a worker thread; libvirt errors and deadlines become ProviderError.

    `slow` marks a call whose slowness means the hypervisor itself is unwell: past its bound the
    provider says once, plainly, what is wrong (`hostcheck.slow_hypervisor`).
    """
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            result = await asyncio.to_thread(fn, *args)
    except TimeoutError:
        if slow is not None:
            slow_hypervisor.observe(slow, what, time.monotonic() - t0, timed_out=True)
        raise ProviderError(f"{what}: the hypervisor did not answer within {timeout:g}s") from None
    except libvirt.libvirtError as e:
        raise ProviderError(f"{what}: {plain_reason(e)}") from None
    if slow is not None:
        slow_hypervisor.observe(slow, what, time.monotonic() - t0)
    return result
