"""The takeover desk of this process: a person holds an attempt's machine during its task, then hands it
back (docs/server-api.md, "Takeovers"; docs/agents.md, "Takeover").

A hold lives here, in memory, like the live relay's tickets: the process that holds the runner's socket
runs the attempt's agent and its live views, so the hold, the agent's gate and the holder's input meet
in one place. Other gh-server processes on the same PostgreSQL see it on the attempt's row (its
`takeovers` entry with `ended_at` null): an agent's machine request that lands in one of them waits
there, reading the row every REMOTE_POLL_S until the hold ends or its cap passes, before it is relayed
to the runner's process (gh_server/machine_relay.py); a request already crossing when the hold began is turned
back there (`answer_relayed` in gh_server/gateway.py) and waits the same way. One hold per attempt:

    take  ->  held  ->  ended (TakeoverEnd)
    - take: an admin (`POST /v1/attempts/{id}/takeover`) on an attempt in its task, on a runner
      connected here whose hello says `task_holds`; the hold belongs to that connection (its session).
      The attempt is marked `assisted` and its `takeovers` entry written (ended_at null); the runner
      is sent `task_hold` held; the agent's
      clock (gh_server/agents/supervisor.py) and its grants' expiry stop; the agent's machine
      requests wait at `passage`.
    - held: only the holder's live view sends input (gh_server/live/screen_relay.py), and each input message
      moves the idle clock and becomes the hold's human steps (gh_server/live/human_steps.py).
    - ended, by exactly one of:
        handed_back    `POST /v1/attempts/{id}/handback` (the holder, or any admin releasing it)
        idle           no input from the holder's view for `takeover_idle_seconds` (the browser closed)
        cap            `takeover_cap_minutes` since the take
        attempt_ended  the attempt left its task (task_end, checking/done, cancel), or the runner's
                       connection the hold was taken on closed (a reconnect's new session keeps its own)
        view_failed    the holder's view failed to open before any input (gh_server/live/screen_relay.py): the
                       hold is undone, its entry taken off the row and `assisted` as the other entries say
      The entry is finished (ended_at, ended_by, held_seconds, counts, events), the runner is sent
      `task_hold` not held, the clocks run again, and the waiting requests are answered (a screen
      fresh, an input or exec `taken_over`).

Two admins at once: the hold is reserved in the desk before the first await, so exactly one wins.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session, load_only

from gh_common.timeouts import within
from gh_server import serialize
from gh_server.agents import grants
from gh_server.live.human_steps import HumanSteps
from gh_server.live.rfb import Message
from gh_server.models import Attempt, utcnow
from gh_server.ports import DeskLink
from gh_server.timestamps import ts
from gh_wire import protocol
from gh_wire.vocab import AttemptStatus, TakeoverEnd, ViewEndReason

log = logging.getLogger(__name__)

# A request waits for the hand-back; the hold ends at its cap on its own, so this only bounds a wait
# whose hold somehow never ended.
PASSAGE_SLACK_S = 60.0
WATCH_EVERY_S = 1.0  # the cap and idle watch looks at least this often
# How often the rows of holds in other processes are read while requests here wait on them (one read
# for all of them): a hand-back there reaches the waiting requests here within this.
REMOTE_POLL_S = 0.5

RefusalCode = Literal["held", "not_running", "not_connected", "not_held"]


class Refused(Exception):
    """A take or hand-back refused (409 with `code` and `extra` in the body)."""

    def __init__(self, code: RefusalCode, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.extra = extra


class NoAttempt(Exception):
    """No attempt with that id."""


@dataclass
class _Remote:
    """A hold another process has, while requests of this one wait on it."""

    ended: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: int = 0


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
    session_id: str = ""  # the runner's connection it was taken on: that connection's close ends it
    recorded: bool = False  # its entry is on the attempt's row (other processes see it)
    steps: HumanSteps = field(default_factory=HumanSteps)
    driven: bool = False  # the holder's view sent input
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
        self._remote: dict[str, _Remote] = {}  # attempt id -> a hold in another process, while waited on here
        self._remote_watch: asyncio.Task[None] | None = None
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
        session_id = None if runner_id is None else self.link.hold_session(runner_id)
        if runner_id is None or session_id is None:
            raise Refused("not_connected", f"The runner of attempt {aid} is not connected to this server process, "
                          "or is too old to pause a task's time limit: its machine cannot be taken over here.")
        hold.runner_id, hold.session_id = runner_id, session_id
        entry = hold.entry()
        begun = await self.link.dbq.run(lambda s: _persist_begin(s, aid, entry, hold.cap_s))
        if begun is not None:
            raise _not_running(aid, *begun)
        hold.recorded = True

    # -- held -------------------------------------------------------------------------------------

    def held(self, attempt_id: str) -> bool:
        return attempt_id in self.holds

    def holding(self, attempt_id: str) -> bool:
        """A hold here whose entry is on the attempt's row: a request relayed from another process is turned
        back (that process then waits on the row; before the row says so it would not wait)."""
        hold = self.holds.get(attempt_id)
        return hold is not None and hold.recorded and hold.ended_by is None

    def holder(self, attempt_id: str, key_id: str) -> Hold | None:
        """The hold when this key holds the attempt's machine now."""
        hold = self.holds.get(attempt_id)
        return hold if hold is not None and hold.key_id == key_id and hold.runner_id else None

    def human_input(self, hold: Hold, msg: Message) -> None:
        """An input message from the holder's view: the idle clock moves, and it becomes a human step."""
        hold.last_input = self._now()
        hold.driven = True
        hold.steps.add(msg, datetime.now(UTC))

    async def view_failed(self, hold: Hold, reason: ViewEndReason) -> bool:
        """The holder's view failed to open (`reason`): the hold is undone, unless its holder drove the
        machine already (a reload's view that failed; the hold goes on to its idle bound). Whether undone."""
        if hold.driven or hold.ended_by is not None or self.holds.get(hold.attempt_id) is not hold:
            return False
        log.warning("the takeover view of %s failed (%s): the hold is undone", hold.attempt_id, reason.value)
        await self.end(hold, TakeoverEnd.VIEW_FAILED)
        return True

    async def passage(self, attempt_id: str, runner_id: str) -> bool:
        """Return once nobody holds the attempt's machine, here or (a shared database, its runner not
        connected here) in the process holding its runner; True when a hold was in progress on arrival.

        A hold elsewhere is read from the attempt's row every REMOTE_POLL_S, at most until its cap (and
        PASSAGE_SLACK_S) is past: then the request goes on."""
        waited = await self._local_passage(attempt_id)
        if self.link.holds_elsewhere(runner_id):
            waited = await self._remote_passage(attempt_id) or waited
        return waited

    async def _local_passage(self, attempt_id: str) -> bool:
        waited = False
        while (hold := self.holds.get(attempt_id)) is not None:
            bound = max(0.0, hold.started + hold.cap_s - self._now()) + PASSAGE_SLACK_S
            self.waiting[attempt_id] += 1
            try:
                await within(bound, hold.ended.wait())
            except TimeoutError:
                log.warning("a request on attempt %s waited out its hold's cap; it goes on", attempt_id)
                return True
            finally:
                self._unwait(attempt_id)
            # A take refused before it began (not running, not connected here) never held the machine.
            waited = waited or hold.ended_by is not None
        return waited

    async def _remote_passage(self, attempt_id: str) -> bool:
        cap_s = self.cap_s
        due = (await self.link.dbq.run(lambda s: _open_holds(s, [attempt_id], cap_s))).get(attempt_id)
        if due is None:
            return False
        remote = self._remote.get(attempt_id)
        if remote is None:
            remote = self._remote[attempt_id] = _Remote()
            # An agent running here whose runner moved to the holding process: its clock stops while it waits.
            self.link.task_held(attempt_id, True)
        remote.waiters += 1
        self.waiting[attempt_id] += 1
        if self._remote_watch is None or self._remote_watch.done():
            self._remote_watch = asyncio.create_task(self._watch_remote(), name="gh-takeover-remote")
        try:
            await within(max(0.0, (due - utcnow()).total_seconds()) + PASSAGE_SLACK_S, remote.ended.wait())
        except TimeoutError:
            log.warning("a request on attempt %s waited out the cap of its hold in another process; it goes on",
                        attempt_id)
        finally:
            self._unwait(attempt_id)
            remote.waiters -= 1
            if remote.waiters <= 0 and self._remote.get(attempt_id) is remote:
                del self._remote[attempt_id]
                self.link.task_held(attempt_id, False)
        return True

    def _unwait(self, attempt_id: str) -> None:
        self.waiting[attempt_id] -= 1
        if self.waiting[attempt_id] <= 0:
            del self.waiting[attempt_id]

    async def _watch_remote(self) -> None:
        """While requests here wait on holds elsewhere: one read of their rows per REMOTE_POLL_S (never a
        busy loop); a hold the row says ended lets its requests go on."""
        while self._remote:
            await asyncio.sleep(REMOTE_POLL_S)
            ids = list(self._remote)
            if not ids:
                continue
            try:
                still = await self.link.dbq.run(functools.partial(_open_holds, attempt_ids=ids, cap_s=self.cap_s))
            except Exception:
                log.warning("could not read the holds of other processes; retrying", exc_info=True)
                continue
            for aid in ids:
                if aid not in still and (remote := self._remote.pop(aid, None)) is not None:
                    remote.ended.set()
                    self.link.task_held(aid, False)

    # -- ended ------------------------------------------------------------------------------------

    async def hand_back(self, attempt_id: str) -> dict[str, Any]:
        """End the hold (`handed_back`): its finished entry.

        Raises:
            Refused: `not_held`; `not_connected` when another gh-server process holds it (its row says so).
        """
        hold = self.holds.get(attempt_id)
        if hold is None or not hold.runner_id:
            cap_s = self.cap_s
            if attempt_id in await self.link.dbq.run(lambda s: _open_holds(s, [attempt_id], cap_s)):
                raise Refused("not_connected", f"Attempt {attempt_id} is held through another gh-server process, "
                              "the one its runner is connected to: hand it back there.")
            raise Refused("not_held", f"Nobody holds attempt {attempt_id}.")
        return await self.end(hold, TakeoverEnd.HANDED_BACK)

    def attempt_left(self, attempt_id: str) -> None:
        """The attempt left its task (its task_end, checking/done, a cancel): its hold ends `attempt_ended`."""
        hold = self.holds.get(attempt_id)
        if hold is not None and hold.runner_id:
            self._spawn_end(hold, TakeoverEnd.ATTEMPT_ENDED)

    def runner_gone(self, runner_id: str, session_id: str) -> None:
        """The runner's connection `session_id` closed: the holds taken on it end `attempt_ended`. A hold
        taken on a newer connection of the same runner (a reconnect while the old close was on its way)
        is not this connection's and goes on."""
        for hold in [h for h in self.holds.values() if h.runner_id == runner_id and h.session_id == session_id]:
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
        undone = reason is TakeoverEnd.VIEW_FAILED
        try:
            await asyncio.shield(self.link.dbq.run(
                lambda s: _persist_end(s, hold.attempt_id, entry, hold.held_seconds or 0.0, hold.cap_s, undone)))
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
        for watch in (self._watch, self._remote_watch):
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watch
        for remote in self._remote.values():
            remote.ended.set()  # the process stops: its waiting requests go on (and fail as it stops)
        self._remote.clear()
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


def _open_holds(session: Session, attempt_ids: list[str], cap_s: float) -> dict[str, datetime]:
    """Of these attempts, those with a hold in progress on their row (serialize.takeover_in_progress, as
    the API shows it) that has not reached its cap: attempt id -> when it does. One read by primary key.
    Past its cap an open entry is no hold to wait on (the process that held it died before ending it)."""
    now = utcnow()
    found: dict[str, datetime] = {}
    rows = session.scalars(select(Attempt).options(load_only(Attempt.id, Attempt.status, Attempt.takeovers))
                           .where(Attempt.id.in_(attempt_ids)))
    for row in rows:
        hold = serialize.takeover_in_progress(row, cap_s=cap_s)
        cap_at = None if hold is None else datetime.fromisoformat(str(hold["cap_at"]))
        if cap_at is not None and cap_at > now:
            found[row.id] = cap_at
    return found


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


def _persist_end(session: Session, attempt_id: str, entry: dict[str, Any], held_s: float, cap_s: float,
                 undone: bool = False) -> None:
    """Finish the hold's entry (`undone`: take it off, and the attempt is assisted only by the others)."""
    a = session.get(Attempt, attempt_id)
    if a is not None:
        same = (entry["started_at"], entry["by_key_id"])
        if undone:
            a.takeovers = [t for t in (a.takeovers or []) if (t.get("started_at"), t.get("by_key_id")) != same]
            a.assisted = bool(a.takeovers)
        else:
            a.takeovers = [entry if (t.get("started_at"), t.get("by_key_id")) == same else t
                           for t in (a.takeovers or [])]
    grants.extend(session, attempt_id, held_s - cap_s)


__all__ = ["Hold", "NoAttempt", "Refused", "TakeoverDesk"]
