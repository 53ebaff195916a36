"""The link the daemon gives each attempt (`gh_runner.attempt.AttemptLink`): its statuses and replay frames.

Statuses are at least once: each is noted in the attempt's in-flight record before it is sent, so
a status lost with the link reaches the server in the next hello (`in_flight_phases`), and a crash
report never names an earlier phase than the server saw. Replay frames are best effort.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from gh_runner.log import get_logger
from gh_runner.registry import RegistryError
from gh_wire.protocol import AttemptStatus, ReplayFrame, SavePoint, SavePointMade
from providers.errors import ProviderError

log = get_logger("gh_runner.attempt_link")

_pushes: set[asyncio.Task[SavePoint | None]] = set()  # save points on their way to the registry


class Publisher(Protocol):
    """gh_runner.library.Library's push: a held version to the registry, its reference back."""

    async def publish(self, start_state_id: str, version: int, image_version: str | None = None) -> str: ...


class DaemonLink:
    def __init__(self, attempt_id: str, *, send: Callable[[Any], Awaitable[bool]],
                 note_phase: Callable[[str, str, datetime], Awaitable[None]],
                 status_acks: Callable[[], bool], save_points_told: Callable[[], bool] = lambda: False,
                 first_seq: int = 0, library: Publisher | None = None) -> None:
        """`note_phase(status, phase, at)` writes the phase into the attempt's in-flight record;
        `status_acks()` says whether the server acknowledges statuses, `save_points_told()` whether it
        takes `save_point_made` (its last welcome); `first_seq` numbers the first replay frame (an
        attempt that goes on from a save point adds frames after the ones it sent before); with a `library`
        (a registry), each save point is pushed there and the server told again with its reference."""
        self.attempt_id = attempt_id
        self._send = send
        self._note_phase = note_phase
        self._status_acks = status_acks
        self._save_points_told = save_points_told
        self._seq = first_seq
        self._library = library
        self._pushed: dict[str, asyncio.Task[SavePoint | None]] = {}  # save point id -> its push

    @property
    def status_acks(self) -> bool:
        return self._status_acks()

    async def status(self, status: str, phase: str) -> None:
        at = datetime.now(UTC)
        if status != "done":  # "done" is followed at once by the result itself
            await self._note_phase(status, phase, at)
        try:
            msg = AttemptStatus(attempt_id=self.attempt_id, status=status,  # type: ignore[arg-type]
                                phase=phase, at=at)
        except ValueError:
            log.warning("attempt reported an unknown status", attempt_id=self.attempt_id, status=status)
            return
        await self._send(msg)

    async def frame(self, label: str, png: bytes, event: dict[str, Any] | None) -> None:
        seq = self._seq
        self._seq += 1
        await self._send(ReplayFrame(attempt_id=self.attempt_id, seq=seq, at=datetime.now(UTC), label=label,
                                     png_b64=base64.b64encode(png).decode(), event=event))

    async def save_point_made(self, point: SavePoint) -> None:
        """Tell the server (so the attempt can go on from it if this runner is lost), then, with a registry,
        push it in the background and tell it again with its reference: another runner can then go on
        from it too. The push is the start-state versions' (gh_runner.library), so a pull is theirs too."""
        if not self._save_points_told():
            return
        await self._send(SavePointMade(attempt_id=self.attempt_id, save_point=point))
        if self._library is not None:
            push = asyncio.create_task(self._push(self._library, point), name=f"push-{point.save_point_id}")
            _pushes.add(push)
            push.add_done_callback(_pushes.discard)
            self._pushed[point.save_point_id] = push

    async def pushed(self, save_point_id: str) -> SavePoint | None:
        """The save point as pushed (with its `registry_ref`) once its push ends; None when it was not
        pushed (no registry, the server not told, or the push failed)."""
        push = self._pushed.get(save_point_id)
        return None if push is None else await asyncio.shield(push)

    async def _push(self, library: Publisher, point: SavePoint) -> SavePoint | None:
        try:
            ref = await library.publish(point.save_point_id, 1)
        except (RegistryError, ProviderError, TimeoutError, OSError) as e:
            # It stays on this runner: the attempt can go on from it here, only not elsewhere.
            log.warning("save point not pushed to the registry", attempt_id=self.attempt_id,
                        save_point_id=point.save_point_id, reason=str(e) or type(e).__name__)
            return None
        pushed = point.model_copy(update={"registry_ref": ref})
        await self._send(SavePointMade(attempt_id=self.attempt_id, save_point=pushed))
        return pushed
