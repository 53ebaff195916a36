"""Per-machine passwords through qemu-ga, at the guest agent's boundary (no guest): the argument
shapes are qga/qapi-schema.json's, `guest-get-users` answers as qga does on Windows."""

from __future__ import annotations

import base64
import string
from typing import Any

import pytest

from providers.errors import MachineNotReady, ProviderError
from providers.qemu.credentials import give_machine_password, new_password, set_password_arguments


class Agent:
    def __init__(self, users: list[list[dict[str, Any]]], fail_set: bool = False) -> None:
        self.users = users
        self.fail_set = fail_set
        self.calls: list[tuple[str, dict[str, Any] | None]] = []

    async def command(self, execute: str, arguments: dict[str, Any] | None = None, *,
                      timeout: float | None = None) -> Any:
        self.calls.append((execute, arguments))
        if execute == "guest-get-users":
            return self.users.pop(0) if len(self.users) > 1 else self.users[0]
        if execute == "guest-set-user-password" and self.fail_set:
            # qga's own wording (commands-win32.c): the user and the Windows error, no password.
            raise ProviderError("guest agent guest-set-user-password: failed to set password: The user name "
                                "could not be found.")
        return {}


def test_passwords_are_random_long_and_meet_windows_complexity() -> None:
    seen = {new_password() for _ in range(200)}
    assert len(seen) == 200
    for pw in seen:
        assert len(pw) == 24
        for cls in (string.ascii_uppercase, string.ascii_lowercase, string.digits):
            assert any(c in cls for c in pw)
        assert not any(c in pw for c in "'\"`$\\ ")


def test_the_password_goes_base64_and_uncrypted_as_qga_wants() -> None:
    args = set_password_arguments("gh", "Pä55-word")
    assert args == {"username": "gh", "password": base64.b64encode("Pä55-word".encode()).decode(), "crypted": False}


async def test_the_password_is_set_only_once_the_user_has_signed_in() -> None:
    agent = Agent([[], [{"user": "SYSTEM"}], [{"user": "GH", "domain": "WIN10", "login-time": 1.5}]])
    creds = await give_machine_password(agent, "gh", timeout=10, poll_s=0.01)
    assert [c for c, _ in agent.calls] == ["guest-get-users"] * 3 + ["guest-set-user-password"]
    sent = agent.calls[-1][1]
    assert sent is not None and base64.b64decode(sent["password"]).decode() == creds.password
    assert creds.username == "gh" and creds.password not in repr(creds)


async def test_no_sign_in_means_not_ready_and_no_password_change() -> None:
    agent = Agent([[]])
    with pytest.raises(MachineNotReady, match=r"gh did not sign in within 0.2s .*signed in: nobody.*auto-logon"):
        await give_machine_password(agent, "gh", timeout=0.2, poll_s=0.05)
    assert all(c == "guest-get-users" for c, _ in agent.calls)


async def test_a_refused_password_is_a_plain_not_ready_without_the_password() -> None:
    agent = Agent([[{"user": "gh"}]], fail_set=True)
    with pytest.raises(MachineNotReady, match="cannot give the machine its own password") as ei:
        await give_machine_password(agent, "gh", timeout=5, poll_s=0.01)
    sent = agent.calls[-1][1]
    assert sent is not None
    assert base64.b64decode(sent["password"]).decode() not in str(ei.value)
