"""The takeover desk of this process: a person holds an attempt's machine during its task, then hands it
back (docs/server-api.md, "Takeovers"; docs/agents.md, "Takeover").

A hold lives here, in memory, like the live relay's tickets: the process that holds the runner's socket
runs the attempt's agent and its live views, so the hold, the agent's gate and the holder's input meet
in one place. One hold per attempt:

    take  ->  held  ->  ended (TakeoverEnd)
    - take: an admin (`POST /v1/attempts/{id}/takeover`) on an attempt in its task, on a runner
      connected here whose hello says `task_holds`. The attempt is marked `assisted` and its
      `takeovers` entry written (ended_at null); the runner is sent `task_hold` held; the agent's
      clock (gh_server/agents/supervisor.py) and its grants' expiry stop; the agent's machine
      requests wait at `passage`.
    - held: only the holder's live view sends input (gh_server/live/relay.py), and each input message
      moves the idle clock and becomes the hold's human steps (gh_server/live/human_steps.py).
    - ended, by exactly one of:
        handed_back    `POST /v1/attempts/{id}/handback` (the holder, or any admin releasing it)
        idle           no input from the holder's view for `takeover_idle_seconds` (the browser closed)
        cap            `takeover_cap_minutes` since the take
        attempt_ended  the attempt left its task (task_end, checking/done, cancel, the runner's link lost)
      The entry is finished (ended_at, ended_by, held_seconds, counts, events), the runner is sent
      `task_hold` not held, the clocks run again, and the waiting requests are answered (a screen
      fresh, an input or exec `taken_over`).

Two admins at once: the hold is reserved in the desk before the first await, so exactly one wins.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

import pydantic
from sqlalchemy.orm import Session

from gh_common.timeouts import within
from gh_server.agents import grants
from gh_server.dbqueue import DbQueue
from gh_server.live.human_steps import HumanSteps
from gh_server.live.rfb import Message
from gh_server.models import Attempt
from gh_server.timestamps import ts
from gh_wire import protocol
from gh_wire.vocab import AttemptStatus, TakeoverEnd

log = logging.getLogger(__name__)

# A request waits for the hand-back; the hold ends at its cap on its own, so this only bounds a wait
# whose hold somehow never ended.
PASSAGE_SLACK_S = 60.0
WATCH_EVERY_S = 1.0  # the cap and idle watch looks at least this often

RefusalCode = Literal["held", "not_running", "not_connected", "not_held"]


class Refused(Exception):
    """A take or hand-back refused (409 with `code` and `extra` in the body)."""

    def __init__(self, code: RefusalCode, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.extra = extra


class NoAttempt(Exception):
    """No attempt with that id."""


class DeskLink(Protocol):
    """What the desk needs of the runner gateway (gh_server/gateway.py)."""

    dbq: DbQueue

    async def send(self, runner_id: str, msg: pydantic.BaseModel) -> bool:
        """False if the runner is not connected to this process."""

    def takes_holds(self, runner_id: str) -> bool:
        """Connected to this process, and its hello said `task_holds`."""

    def task_held(self, attempt_id: str, held: bool) -> None:
        """Stop (held) or start again the clock of the attempt's agent, when it runs here."""


@dataclass
class Hold:
    attempt_id: str
    key_id: str
    key_name: str
    started_at: datetime
    started: float  # the desk's clock
    cap_s: float
    idle_s: float
    last_input: float
    runner_id: str = ""
    steps: HumanSteps = field(default_factory=HumanSteps)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    ended_by: TakeoverEnd | None = None
    held_seconds: float | None = None
    ended_at: datetime | None = None

    @property
    def cap_at(self) -> datetime:
        return self.started_at + timedelta(seconds=self.cap_s)

    def in_progress(self) -> dict[str, Any]:
        """`takeover` on GET /v1/attempts/{id} and the steps feed."""
        return {"by": self.key_name, "started_at": ts(self.started_at), "cap_at": ts(self.cap_at)}

    def entry(self) -> dict[str, Any]:
        """Its `attempts.takeovers` entry."""
        return {
            "by": self.key_name, "by_key_id": self.key_id, "started_at": ts(self.started_at),
            "ended_at": ts(self.ended_at), "ended_by": self.ended_by.value if self.ended_by else None,
            "held_seconds": self.held_seconds, "counts": self.steps.as_counts(),
            "events": list(self.steps.events), "events_dropped": self.steps.dropped,
        }


class TakeoverDesk:
    def __init__(self, link: DeskLink, cap_s: float, idle_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.link = link
        self.cap_s = cap_s
        self.idle_s = idle_s
        self._now = clock
        self.holds: dict[str, Hold] = {}  # attempt id -> its hold (reserved at take, gone once ended)
        self.waiting: collections.Counter[str] = collections.Counter()  # attempt id -> its requests held now
        self._watch: asyncio.Task[None] | None = None
        self._ending: set[asyncio.Task[Any]] = set()
        # Called on the server's loop with each hold that ended (the relay ends the holder's views).
        self.on_ended: list[Callable[[Hold], object]] = []

    # -- take -------------------------------------------------------------------------------------

    async def take(self, attempt_id: str, key_id: str, key_name: str) -> Hold:
        """Hold the attempt's machine for this key (the holder asking again gets its hold back).

        Raises:
            Refused: `held` by another key, `not_running` (not in its task), `not_connected`.
            NoAttempt: no such attempt.
        """
        held = self.holds.get(attempt_id)
        if held is not None:
            if held.key_id == key_id and held.runner_id:
                return held
            raise Refused("held", f"Attempt {attempt_id} is held by {held.key_name} since {ts(held.started_at)}.",
                          held_by=held.key_name, since=ts(held.started_at))
        now = self._now()
        hold = Hold(attempt_id, key_id, key_name, datetime.now(UTC), now, self.cap_s, self.idle_s, now)
        self.holds[attempt_id] = hold  # reserved before any await: a second take now sees `held`
        try:
            await self._begin(hold)
        except BaseException:
            if self.holds.get(attempt_id) is hold:
                del self.holds[attempt_id]
            hold.ended.set()  # a request that came in meanwhile goes on
            raise
        self.link.task_held(attempt_id, True)
        if not await self.link.send(hold.runner_id, protocol.TaskHold(attempt_id=attempt_id, held=True)):
            await self.end(hold, TakeoverEnd.ATTEMPT_ENDED)
            raise Refused("not_connected", f"The runner of attempt {attempt_id} left as it was taken over.")
        log.info("attempt %s taken over by %s", attempt_id, key_name)
        if self._watch is None or self._watch.done():
            self._watch = asyncio.create_task(self._watch_holds(), name="gh-takeover-watch")
        return hold

    async def _begin(self, hold: Hold) -> None:
        aid = hold.attempt_id
        found = await self.link.dbq.run(lambda s: _state(s, aid))
        if found is None:
            raise NoAttempt(aid)
        status, outcome, runner_id = found
        if status != AttemptStatus.RUNNING:
            raise _not_running(aid, status, outcome)
        if runner_id is None or not self.link.takes_holds(runner_id):
            raise Refused("not_connected", f"The runner of attempt {aid} is not connected to this server, or is "
                          "too old to pause a task's time limit: its machine cannot be taken over.")
        hold.runner_id = runner_id
        entry = hold.entry()
        begun = await self.link.dbq.run(lambda s: _persist_begin(s, aid, entry, hold.cap_s))
        if begun is not None:
            raise _not_running(aid, *begun)

    # -- held -------------------------------------------------------------------------------------

    def held(self, attempt_id: str) -> bool:
        return attempt_id in self.holds

    def holder(self, attempt_id: str, key_id: str) -> Hold | None:
        """The hold when this key holds the attempt's machine now."""
        hold = self.holds.get(attempt_id)
        return hold if hold is not None and hold.key_id == key_id and hold.runner_id else None

    def human_input(self, hold: Hold, msg: Message) -> None:
        """An input message from the holder's view: the idle clock moves, and it becomes a human step."""
        hold.last_input = self._now()
        hold.steps.add(msg, datetime.now(UTC))

    async def passage(self, attempt_id: str) -> bool:
        """Return once nobody holds the attempt's machine; True when a hold was in progress on arrival."""
        waited = False
        while (hold := self.holds.get(attempt_id)) is not None:
            waited = True
            bound = max(0.0, hold.started + hold.cap_s - self._now()) + PASSAGE_SLACK_S
            self.waiting[attempt_id] += 1
            try:
                await within(bound, hold.ended.wait())
            except TimeoutError:
                log.warning("a request on attempt %s waited out its hold's cap; it goes on", attempt_id)
                return True
            finally:
                self.waiting[attempt_id] -= 1
                if self.waiting[attempt_id] <= 0:
                    del self.waiting[attempt_id]
        return waited

    # -- ended ------------------------------------------------------------------------------------

    async def hand_back(self, attempt_id: str) -> dict[str, Any]:
        """End the hold (`handed_back`): its finished entry.

        Raises:
            Refused: `not_held`.
        """
        hold = self.holds.get(attempt_id)
        if hold is None or not hold.runner_id:
            raise Refused("not_held", f"Nobody holds attempt {attempt_id}.")
        return await self.end(hold, TakeoverEnd.HANDED_BACK)

    def attempt_left(self, attempt_id: str) -> None:
        """The attempt left its task (its task_end, checking/done, a cancel): its hold ends `attempt_ended`."""
        hold = self.holds.get(attempt_id)
        if hold is not None and hold.runner_id:
            self._spawn_end(hold, TakeoverEnd.ATTEMPT_ENDED)

    def runner_gone(self, runner_id: str) -> None:
        """The runner's link is gone: the holds of its attempts end `attempt_ended`."""
        for hold in [h for h in self.holds.values() if h.runner_id == runner_id]:
            self._spawn_end(hold, TakeoverEnd.ATTEMPT_ENDED)

    async def end(self, hold: Hold, reason: TakeoverEnd) -> dict[str, Any]:
        """End `hold` for `reason` (once: a second call returns the entry as it ended)."""
        if hold.ended_by is not None:
            await hold.ended.wait()
            return hold.entry()
        hold.ended_by = reason
        hold.held_seconds = round(max(0.0, self._now() - hold.started), 3)
        hold.ended_at = datetime.now(UTC)
        if self.holds.get(hold.attempt_id) is hold:
            del self.holds[hold.attempt_id]
        self.link.task_held(hold.attempt_id, False)
        try:
            # The runner's clock first, then the agent's requests: the task's time runs again as they go on.
            if reason is not TakeoverEnd.ATTEMPT_ENDED:
                await self.link.send(hold.runner_id, protocol.TaskHold(attempt_id=hold.attempt_id, held=False))
        finally:
            hold.ended.set()
        entry = hold.entry()
        try:
            await asyncio.shield(self.link.dbq.run(
                lambda s: _persist_end(s, hold.attempt_id, entry, hold.held_seconds or 0.0, hold.cap_s)))
        except Exception:
            log.exception("could not record the end of the takeover of %s", hold.attempt_id)
        log.info("takeover of %s ended: %s after %.1f s (%d keys, %d clicks, %d typed)", hold.attempt_id,
                 reason.value, hold.held_seconds, hold.steps.keys, hold.steps.clicks, hold.steps.typed)
        for hook in self.on_ended:
            try:
                hook(hold)
            except Exception:
                log.exception("a takeover's end hook failed")
        return entry

    async def expire_due(self) -> None:
        """End the holds past their cap or idle for too long (the watch calls this; tests too)."""
        now = self._now()
        for hold in [h for h in self.holds.values() if h.runner_id]:
            if now - hold.started >= hold.cap_s:
                await self.end(hold, TakeoverEnd.CAP)
            elif now - hold.last_input >= hold.idle_s:
                await self.end(hold, TakeoverEnd.IDLE)

    async def close(self) -> None:
        """The process stops: every hold ends (its runner's clocks run again) and the watch stops."""
        for hold in list(self.holds.values()):
            if hold.runner_id:
                with contextlib.suppress(Exception):
                    await self.end(hold, TakeoverEnd.ATTEMPT_ENDED)
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
        for task in list(self._ending):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _spawn_end(self, hold: Hold, reason: TakeoverEnd) -> None:
        task = asyncio.create_task(self.end(hold, reason), name=f"gh-takeover-end-{hold.attempt_id}")
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def _watch_holds(self) -> None:
        """While there are holds: end each at its cap or idle bound."""
        while self.holds:
            due = min((min(h.started + h.cap_s, h.last_input + h.idle_s) for h in self.holds.values()),
                      default=self._now())
            await asyncio.sleep(min(WATCH_EVERY_S, max(0.0, due - self._now())))
            try:
                await self.expire_due()
            except Exception:
                log.exception("the takeover watch failed; it goes on")


def _not_running(attempt_id: str, status: str, outcome: str | None) -> Refused:
    now = f"is {status}" + (f" ({outcome})" if outcome else "")
    return Refused("not_running", f"Attempt {attempt_id} {now}: only an attempt in its task can be taken over.",
                   status=status, outcome=outcome)


def _state(session: Session, attempt_id: str) -> tuple[str, str | None, str | None] | None:
    a = session.get(Attempt, attempt_id)
    return None if a is None else (a.status, a.outcome, a.runner_id)


def _persist_begin(session: Session, attempt_id: str, entry: dict[str, Any],
                   cap_s: float) -> tuple[str, str | None] | None:
    """Mark the attempt assisted and add the hold's entry; (status, outcome) when it left its task meanwhile.
    Its grants outlive the cap (the hold's end gives back what was not held)."""
    a = session.get(Attempt, attempt_id)
    if a is None or a.status != AttemptStatus.RUNNING:
        return (a.status, a.outcome) if a is not None else ("gone", None)
    a.assisted = True
    a.takeovers = [*(a.takeovers or []), entry]
    grants.extend(session, attempt_id, cap_s)
    return None


def _persist_end(session: Session, attempt_id: str, entry: dict[str, Any], held_s: float, cap_s: float) -> None:
    a = session.get(Attempt, attempt_id)
    if a is not None:
        a.takeovers = [entry if (t.get("started_at"), t.get("by_key_id")) == (entry["started_at"], entry["by_key_id"])
                       else t for t in (a.takeovers or [])]
    grants.extend(session, attempt_id, held_s - cap_s)


__all__ = ["DeskLink", "Hold", "NoAttempt", "Refused", "TakeoverDesk"]
