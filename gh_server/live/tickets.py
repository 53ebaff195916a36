"""Live-view tickets: what `POST /v1/start_states/{id}/view` hands the page, and the one thing that opens
`/v1/live/{ticket}` (a browser cannot put an API key on a WebSocket).

A ticket is random (`lv_` + 32 bytes), lives TICKET_TTL_S, is taken once, and is bound to the machine
(a start state's, or an attempt's), the key that asked and whether that key may send input. They live
in this process's memory: the viewer's WebSocket must reach the process that issued it, and a restart
ends them (a page asks again).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

TICKET_PREFIX = "lv_"
TICKET_TTL_S = 30.0
MAX_TICKETS = 4096  # unexpired at once, across every key: past this, new ones are refused
MAX_TICKETS_PER_KEY = 32  # unexpired at once for one key: one key cannot take the others' tickets
# How often one key is given a watcher's ticket: 8 at once, then one every 2 s. A page asks once per view it opens;
# a key that opens and drops views in a loop (bench/live_abuse.py, small_flood) made the server open a view
# for each, back to back, and that opening is the most a view costs the server.
TICKET_BURST_PER_KEY = 8
TICKETS_PER_KEY_PER_S = 0.5


@dataclass(frozen=True)
class Ticket:
    value: str
    key_id: str
    key_name: str
    read_only: bool
    expires_at: datetime
    deadline: float  # monotonic
    start_state_id: str | None = None
    attempt_id: str | None = None


class TooManyTickets(Exception):
    """MAX_TICKETS unexpired tickets are out already, or MAX_TICKETS_PER_KEY of the asking key's."""


class Tickets:
    def __init__(self, ttl: float = TICKET_TTL_S, clock: Callable[[], float] = time.monotonic,
                 limit: int = MAX_TICKETS, per_key: int = MAX_TICKETS_PER_KEY,
                 rate: tuple[float, float] | None = (TICKETS_PER_KEY_PER_S, TICKET_BURST_PER_KEY)) -> None:
        """`rate`: (watchers' tickets a second, burst) one key is given (`admit`); None: unlimited."""
        self.ttl = ttl
        self._clock = clock
        self._limit = limit
        self._per_key = per_key
        self._rate = rate
        self._buckets: dict[str, tuple[float, float]] = {}  # key id -> (tickets left, when counted)
        self._live: dict[str, Ticket] = {}

    def issue(self, *, key_id: str, key_name: str, read_only: bool, start_state_id: str | None = None,
              attempt_id: str | None = None) -> Ticket:
        """A new ticket for exactly one of `start_state_id` and `attempt_id`.

        Raises:
            TooManyTickets: the limit of unexpired tickets is reached.
        """
        if (start_state_id is None) == (attempt_id is None):
            raise ValueError("a ticket is for one start state or one attempt")
        self._prune()
        if len(self._live) >= self._limit:
            raise TooManyTickets(f"{self._limit} live-view tickets are out; try again in {self.ttl:g} s")
        if sum(t.key_id == key_id for t in self._live.values()) >= self._per_key:
            raise TooManyTickets(f"this key has {self._per_key} unused live-view tickets out; open them, or try "
                                 f"again in {self.ttl:g} s")
        now = self._clock()
        ticket = Ticket(value=TICKET_PREFIX + secrets.token_urlsafe(32), key_id=key_id, key_name=key_name,
                        read_only=read_only, expires_at=datetime.now(UTC) + timedelta(seconds=self.ttl),
                        deadline=now + self.ttl, start_state_id=start_state_id, attempt_id=attempt_id)
        self._live[ticket.value] = ticket
        return ticket

    def unused(self, key_id: str, machine: str) -> int:
        """The key's unexpired watchers' tickets of that machine (an attempt's or start state's id)."""
        self._prune()
        return sum(t.key_id == key_id and t.read_only and machine in (t.attempt_id, t.start_state_id)
                   for t in self._live.values())

    def admit(self, key_id: str) -> None:
        """A watcher's ticket may be asked for by this key now (its rate, counted here): called before anything
        is looked up for it. The views that drive (a takeover's holder, a start state's admin) are not counted.

        Raises:
            TooManyTickets: the key asked for its burst and its rate since.
        """
        if self._rate is None:
            return
        per_s, burst = self._rate
        now = self._clock()
        left, at = self._buckets.get(key_id, (burst, now))
        left = min(burst, left + (now - at) * per_s)
        if left < 1.0:
            raise TooManyTickets(f"this key asked for {burst:g} live-view tickets in a short time; the next in "
                                 f"{(1.0 - left) / per_s:.1f} s")
        self._buckets[key_id] = (left - 1.0, now)

    def take(self, value: str) -> Ticket | None:
        """The ticket, now used; None when it is unknown, used already or expired."""
        ticket = self._live.pop(value, None)
        if ticket is None or self._clock() >= ticket.deadline:
            return None
        return ticket

    def discard(self, value: str) -> None:
        """The ticket will not be used (what it was for was refused)."""
        self._live.pop(value, None)

    def _prune(self) -> None:
        now = self._clock()
        for value in [v for v, t in self._live.items() if now >= t.deadline]:
            del self._live[value]
        if self._rate is not None:  # a key's full bucket is as good as none
            per_s, burst = self._rate
            for key_id in [k for k, (left, at) in self._buckets.items() if left + (now - at) * per_s >= burst]:
                del self._buckets[key_id]


__all__ = ["MAX_TICKETS", "MAX_TICKETS_PER_KEY", "TICKETS_PER_KEY_PER_S", "TICKET_BURST_PER_KEY", "TICKET_TTL_S",
           "Ticket", "Tickets", "TooManyTickets"]
