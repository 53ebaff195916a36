"""Per-machine account passwords: each machine's WinRM account gets its own random password.

Every machine of an image starts from the same disk, so with the image's password an agent that is
an administrator in one attempt (and can read its own machine's password) could log into a
sibling's machine over the isolated network. So when a machine's qemu-ga answers, and before WinRM
is used, the runner sets a fresh password through qemu-ga (`guest-set-user-password`, which on
Windows is NetUserSetInfo level 1003) and keeps it only in memory, on that machine's object: it is
never written to disk, logged, or put in an error.

The auto-logon reads its password at sign-in, so the new one is set only after the account has
signed in (qemu-ga's `guest-get-users` lists it): changing it earlier would break the auto-logon.
A guest rebooted by a script then stops at the sign-in screen: documented in docs/operations.md.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import string
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from providers.errors import MachineNotReady, ProviderError

PASSWORD_LENGTH = 24
_SYMBOLS = "-_.+=!#%"  # no quote, space, backslash, '$' or '`': safe in every shell and in XML


class AgentCommands(Protocol):
    async def command(self, execute: str, arguments: dict[str, Any] | None = None, *,
                      timeout: float | None = None) -> Any: ...


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)  # repr (and so any log of this object) never shows it


def new_password(length: int = PASSWORD_LENGTH) -> str:
    """A random password that meets Windows' complexity rule (three of four classes, here all four)
    whether or not the image enforces it."""
    classes = (string.ascii_uppercase, string.ascii_lowercase, string.digits, _SYMBOLS)
    alphabet = "".join(classes)
    while True:
        pw = "".join(secrets.choice(alphabet) for _ in range(length))
        if all(any(c in cls for c in pw) for cls in classes):
            return pw


def set_password_arguments(username: str, password: str) -> dict[str, Any]:
    """qemu-ga's `guest-set-user-password` arguments (qga/qapi-schema.json): the password is
    base64 of its UTF-8 bytes, and `crypted` must be false on Windows (qga/commands-win32.c
    refuses a crypted one)."""
    return {"username": username, "password": base64.b64encode(password.encode()).decode(), "crypted": False}


async def signed_in_users(agent: AgentCommands) -> list[str]:
    users = await agent.command("guest-get-users")
    return [str(u.get("user", "")) for u in users or [] if isinstance(u, dict)]


async def give_machine_password(agent: AgentCommands, username: str, *, timeout: float,
                                alive: Callable[[], Awaitable[None]] | None = None,
                                poll_s: float = 1.0) -> Credentials:
    """Wait until `username` has signed in, then set a new random password for it; return it.

    Raises:
        MachineNotReady: the user did not sign in within `timeout`, or the password could not be set.
    """
    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            users = await signed_in_users(agent)
            if any(u.lower() == username.lower() for u in users):
                break
            last = f"signed in: {', '.join(users) or 'nobody'}"
        except ProviderError as e:
            last = str(e)
        if alive is not None:
            await alive()
        if time.monotonic() >= deadline:
            raise MachineNotReady(f"{username} did not sign in within {timeout:g}s ({last}); is auto-logon set up?")
        await asyncio.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
    creds = Credentials(username, new_password())
    try:
        await agent.command("guest-set-user-password", set_password_arguments(username, creds.password),
                            timeout=max(5.0, deadline - time.monotonic()))
    except ProviderError as e:
        # qemu-ga's error text names the user and the Windows error, never the password.
        raise MachineNotReady(f"cannot give the machine its own password: {e}") from None
    return creds


__all__ = ["Credentials", "give_machine_password", "new_password", "set_password_arguments", "signed_in_users"]
