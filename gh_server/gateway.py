"""The runner gateway: the websocket endpoint runners dial (`/v1/runners/connect`).

One socket per runner. The gateway authenticates it (Bearer runner token, sha256 in the DB,
compared in constant time), records its hello on the runner row, answers welcome, keeps it alive
with heartbeats both ways, and turns its frames into row changes (results applied once, statuses
moved forward, replay frames stored once) through one batched DB writer (`DbQueue`), and hands each
to its owner: results to `attempts.intake`, refusals to the scheduler, statuses to `attempts.states`
and the agent supervisor, job results to the start-state service. app.py builds those and hands them
in; the gateway runs them as long as it runs. It implements `GatewayPort` for the API (kick a revoked
runner, send it a message, relay a machine request).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pydantic
from fastapi import WebSocket
from sqlalchemy.orm import Session

from gh_common.timeouts import timeout, within
from gh_server import runner_rows as rows
from gh_server.agents.supervisor import AgentSupervisor
from gh_server.attempts.intake import ResultIntake
from gh_server.attempts.lease import SavePointPolicy
from gh_server.attempts.resume import record_save_point, restore_refused, resume_elsewhere, resume_lease
from gh_server.attempts.scheduler import Scheduler
from gh_server.attempts.states import Reconciled, apply_status, reconcile_in_flight, release_lease
from gh_server.dbqueue import DbQueue
from gh_server.machine_relay import PgRelay
from gh_server.models import utcnow
from gh_server.ports import AttemptEvents, JobResultApplier, RunnerHere, RunnerLink
from gh_server.takeover.link import desk_for
from gh_wire import protocol
from gh_wire.vocab import AttemptStatus, CancelReason, ErrorCode

if TYPE_CHECKING:
    from gh_server.state import ServerState

log = logging.getLogger(__name__)

PATH = "/v1/runners/connect"
HELLO_TIMEOUT_S = 30.0
# A runner that refuses this many leases in a row (full with start-state jobs, a disk problem, ...) gets no
# more until its next heartbeat: the DB's count of its attempts cannot see everything that holds its slots.
PAUSE_AFTER_REFUSALS = 2
SEND_TIMEOUT_S = 30.0
LATE_FRAME_S = 0.1  # the second look for a frame when the dead-peer bound runs out (_read)
# A runner's new hello waits at most this long for its replaced connection to handle what that one had
# already received (longer than a frame's handling under load, short beside the runner's hello timeout),
REPLACED_DRAIN_S = 10.0
# and takes it as drained once its reader has waited this long for a frame with none coming: a few turns of
# the loop, in which bytes already in the socket (its reading paused while frames queued) are read.
REPLACED_QUIET_S = 0.05


@dataclass
class _Conn:
    runner_id: str
    name: str
    session_id: str
    ws: WebSocket
    lock: asyncio.Lock
    closed: asyncio.Event
    last_db_seen: float = 0.0
    busy: int = 0
    reconciled: Reconciled | None = None
    draining: bool = False  # said so in a heartbeat: offer it nothing
    refused_in_row: int = 0  # refusals since its last accept: a runner that keeps refusing is paused
    status_acks: bool = False  # its hello asked for `status_ack`
    paused: protocol.LeaseRefusal | None = None  # its heartbeat says it takes no leases (hypervisor_down)
    live_views: bool = False  # its hello said it takes `view_open`
    task_holds: bool = False  # its hello said it takes `task_hold` (its attempts can be taken over)
    restores: bool = False  # its hello said it takes a lease's `restore` (an attempt going on from a save point)
    replaced: bool = False  # a newer connection of this runner took over: what this one received is still handled
    waiting: bool = False  # its reader waits for the next frame (not handling one)
    frames_in: int = 0  # frames its reader has taken, to tell a reader that waited all along from one that came back
    done: asyncio.Event = field(default_factory=asyncio.Event)  # its session ended: its reader and cleanup ran

    @property
    def leasable(self) -> bool:
        return (not self.closed.is_set() and not self.replaced and not self.draining and self.paused is None
                and self.refused_in_row < PAUSE_AFTER_REFUSALS)

    async def send(self, msg: pydantic.BaseModel) -> bool:
        """Send one message; False when the socket is gone or the frame is over the limit (never sent:
        the runner would close the whole connection, failing every other request on it)."""
        try:
            frame = protocol.encode_checked(msg)
        except protocol.FrameTooLarge as e:
            log.warning("not sending to runner %s: %s", self.name, e)
            return False
        return await self.send_frame(frame)

    async def send_frame(self, frame: str) -> bool:
        if self.closed.is_set():
            return False
        try:
            async with self.lock:
                await within(SEND_TIMEOUT_S, self.ws.send_text(frame))
            return True
        except Exception:  # a socket that broke under us: the reader will notice and clean up
            self.closed.set()
            return False

    async def close(self, code: int, reason: str) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        with contextlib.suppress(Exception):
            await within(5.0, self.ws.close(code=code, reason=reason[:120]))


class _Rejected(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


# ---------------------------------------------------------------------------------------------
# The gateway
# ---------------------------------------------------------------------------------------------


class Gateway:
    """The sockets. What it hands frames to is built by app.py: the agent supervisor and the result
    intake (made from this gateway by `agents` and `intake`, as they talk to runners through it), and
    in `run` the scheduler and the PostgreSQL relay."""

    def __init__(
        self,
        state: ServerState,
        agents: Callable[[RunnerLink], AgentSupervisor],
        intake: Callable[[RunnerLink, AttemptEvents], ResultIntake],
        apply_job_result: JobResultApplier,
    ) -> None:
        self.state = state
        # What a finished start-state job means is the start-state service's (app.py passes it in).
        self.apply_job_result = apply_job_result
        self.settings = state.settings
        self.dbq = DbQueue(state.db)
        self.conns: dict[str, _Conn] = {}
        # request id -> (runner id, session id it was sent on, answer)
        self._pending: dict[str, tuple[str, str, asyncio.Future[protocol.MachineResponse]]] = {}
        self.metrics = state.metrics
        self.scheduler: Scheduler | None = None
        self._handed_off: dict[str, str] = {}  # attempt id -> the runner that handed it off (drain --migrate)
        self.relay: PgRelay | None = None  # PostgreSQL: machine requests for runners held by other processes
        # A person's hold on an attempt's machine: here, beside the runner's socket and the agent it gates.
        self.takeovers = desk_for(self, self.settings)
        self.agents = agents(self)
        # Results are applied even before the scheduler runs (it is told through `run_changed` and `poke`).
        self.intake = intake(self, self)
        # A runner's `view_refused`, to the live views of this process (gh_server/live/screen_relay.py sets it).
        self.on_view_refused: Callable[[str, protocol.ViewRefused], None] | None = None
        self._started = False

    # -- lifecycle ------------------------------------------------------------------------------

    async def ensure_started(self) -> None:
        if not self._started:
            self._started = True
            await self.dbq.start()

    async def run(self, scheduler: Scheduler, relay: PgRelay | None) -> None:
        """The background task (app lifespan): what app.py hands in lives as long as this."""
        await self.ensure_started()
        self.scheduler, self.relay = scheduler, relay
        scheduler.start()
        if relay is not None:
            relay.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        await self.takeovers.close()
        await self.agents.stop_all()
        if self.relay is not None:
            await self.relay.stop()
        await self.intake.stop()
        if self.scheduler is not None:
            await self.scheduler.stop()
        conns = list(self.conns.values())
        for conn in conns:
            await conn.close(protocol.CLOSE_SERVER_SHUTDOWN, "server shutting down")
        if conns:  # so the API shows them offline now, not when their last_seen_at ages out
            with contextlib.suppress(Exception):

                def gone(s: Session) -> None:
                    for c in conns:
                        rows.record_disconnect(s, c.runner_id, c.session_id)

                await self.dbq.run(gone)
        for _, _, fut in list(self._pending.values()):
            if not fut.done():
                fut.set_result(protocol.MachineResponse(request_id="", ok=False, error="server shutting down"))
        await self.dbq.stop()
        self._started = False

    # -- AttemptEvents (what the result intake tells the scheduler, once it runs) -----------------

    def poke(self) -> None:
        if self.scheduler is not None:
            self.scheduler.poke()
        elif self.state.wakeup is not None:
            self.state.wakeup.set()

    def run_changed(self, run_id: str | None) -> None:
        if self.scheduler is not None:
            self.scheduler.run_changed(run_id)

    def retry_queued(self, retry_id: str, after_runner_id: str, attempts_so_far: int) -> None:
        if self.scheduler is not None:
            self.scheduler.space_retry(retry_id, after_runner_id, attempts_so_far)

    # -- GatewayPort --------------------------------------------------------------------------

    def connected(self, runner_id: str) -> bool:
        c = self.conns.get(runner_id)
        return c is not None and not c.closed.is_set()

    def takes_views(self, runner_id: str) -> bool:
        """Connected to this process, and its hello said it takes `view_open`."""
        c = self.conns.get(runner_id)
        return c is not None and not c.closed.is_set() and c.live_views

    def task_time_left(self, attempt_id: str) -> float | None:
        return self.agents.time_left(attempt_id)

    # -- HoldHost (what the takeover's link reads: gh_server/takeover/link.py) --------------------

    def runner_here(self, runner_id: str) -> RunnerHere | None:
        """The runner's open connection to this process, as its hello described it."""
        c = self.conns.get(runner_id)
        if c is None or c.closed.is_set():
            return None
        return RunnerHere(session_id=c.session_id, live_views=c.live_views, task_holds=c.task_holds)

    @property
    def shares_runners(self) -> bool:
        """PostgreSQL: other processes hold runners' sockets, and this one relays to them."""
        return self.relay is not None

    @property
    def clocks(self) -> AgentSupervisor:
        return self.agents

    def _task_over(self, attempt_id: str) -> None:
        """The attempt left its task: its agent stops, and a person's hold on its machine ends."""
        self.agents.stop(attempt_id)
        self.takeovers.attempt_left(attempt_id)

    def local_runner_ids_all(self) -> list[str]:
        """The runners whose sockets this process holds (leasable or not)."""
        return [rid for rid, c in self.conns.items() if not c.closed.is_set()]

    def restoring_runner_ids(self) -> list[str]:
        """The leasable runners here that take a lease's `restore`: where a lost runner's attempt may go on."""
        return [rid for rid, c in self.conns.items() if c.leasable and c.restores]

    async def resumed_elsewhere(self, runner_id: str, lease: protocol.Lease) -> None:
        """An attempt whose runner is gone goes on on `runner_id` from a save point (attempts/resume.py):
        its agent follows it there, and the runner gets the lease."""
        assert lease.restore is not None
        await self.agents.resumed(lease.attempt_id, lease.restore.save_point, runner_id)
        if not await self.send(runner_id, lease):
            log.warning("the lease resuming %s did not reach runner %s; its hello will tell", lease.attempt_id,
                        runner_id)
        await self.agents.resend_task_ends(runner_id, [lease.attempt_id], [])  # one its agent ended meanwhile
        log.info("attempt %s goes on from save point %s (step %d) on runner %s, its own runner gone",
                 lease.attempt_id, lease.restore.save_point.save_point_id, lease.restore.save_point.step, runner_id)

    def local_runner_ids(self) -> list[str]:
        """The runners the scheduler of this process may lease to now."""
        return [rid for rid, c in self.conns.items() if c.leasable]

    async def send(self, runner_id: str, msg: pydantic.BaseModel) -> bool:
        c = self.conns.get(runner_id)
        return c is not None and await c.send(msg)

    async def kick(self, runner_id: str, code: int, reason: str) -> None:
        c = self.conns.get(runner_id)
        if c is not None:
            await c.close(code, reason)

    async def machine_request(
        self, runner_id: str, req: protocol.MachineRequest, timeout: float
    ) -> protocol.MachineResponse:
        """Relay a request and wait for its answer; never raises (a failure is `ok=False` with why).

        A runner connected to another process (PostgreSQL) is reached through that process (gh_server.machine_relay)."""
        if runner_id not in self.conns and self.relay is not None:
            return await self.relay.forward(runner_id, req, timeout)
        return await self.machine_request_here(runner_id, req, timeout)

    async def answer_relayed(
        self, runner_id: str, req: protocol.MachineRequest, timeout: float
    ) -> protocol.MachineResponse:
        """A request another process relayed here (gh_server.machine_relay): turned back `taken_over` when a person
        holds its attempt's machine here, so that it waits there, where its timeout has not begun (it
        crossed as the hold began: that process's gate found none on the row yet)."""
        if req.attempt_id is not None and self.takeovers.holding(req.attempt_id):
            return protocol.MachineResponse(request_id=req.request_id, ok=False,
                                            refusal=protocol.MachineRefusal.TAKEN_OVER,
                                            error="a person holds this machine: wait for the hand-back")
        return await self.machine_request_here(runner_id, req, timeout)

    async def machine_request_here(
        self, runner_id: str, req: protocol.MachineRequest, timeout: float
    ) -> protocol.MachineResponse:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[protocol.MachineResponse] = loop.create_future()
        conn = self.conns.get(runner_id)
        self._pending[req.request_id] = (runner_id, conn.session_id if conn else "", fut)
        try:
            try:
                frame = protocol.encode_checked(req)
            except protocol.FrameTooLarge as e:
                return protocol.MachineResponse(
                    request_id=req.request_id, ok=False, refusal=protocol.MachineRefusal.REQUEST_TOO_LARGE,
                    error=f"the {req.op} request is {e.size} bytes encoded, over the runner frame limit of "
                          f"{e.limit} bytes; send a smaller script, env or event list",
                )
            if conn is None or not await conn.send_frame(frame):
                return protocol.MachineResponse(
                    request_id=req.request_id, ok=False, refusal=protocol.MachineRefusal.AWAY,
                    error="the runner holding this machine is not connected",
                )
            try:
                return await within(timeout, asyncio.shield(fut))
            except TimeoutError:
                return protocol.MachineResponse(
                    request_id=req.request_id,
                    ok=False,
                    timed_out=True,
                    error=f"the runner did not answer within {timeout:g} s",
                )
        finally:
            self._pending.pop(req.request_id, None)

    # -- the websocket ------------------------------------------------------------------------

    async def endpoint(self, ws: WebSocket) -> None:
        await self.ensure_started()
        # Accept first: a close code (4001) can only be told to a client on an open socket.
        await ws.accept()
        conn: _Conn | None = None
        try:
            conn = await self._open(ws)
        except _Rejected as r:
            with contextlib.suppress(Exception):
                await ws.close(code=r.code, reason=r.reason[:120])
            return
        except Exception:
            log.exception("runner connection setup failed")
            with contextlib.suppress(Exception):
                await ws.close(code=1011, reason="internal error")
            return
        beat = asyncio.create_task(self._heartbeats(conn), name=f"gh-beat-{conn.runner_id}")
        try:
            await self._after_hello(conn)
            await self._read(conn)
        except Exception:
            log.exception("runner %s session failed", conn.name)
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            await conn.close(1000, "bye")
            await self._closed(conn)
            conn.done.set()

    async def _open(self, ws: WebSocket) -> _Conn:
        auth = ws.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _Rejected(protocol.CLOSE_TOKEN_REVOKED, "missing Bearer runner token")
        found = await self.dbq.run(lambda s: rows.runner_by_token(s, token))
        if found is None:
            raise _Rejected(protocol.CLOSE_TOKEN_REVOKED, "unknown or revoked runner token")
        runner_id, name = found
        try:
            raw = await within(HELLO_TIMEOUT_S, self._receive(ws))
        except TimeoutError:
            raise _Rejected(protocol.CLOSE_HEARTBEAT_TIMEOUT, "no hello") from None
        if raw is None:
            raise _Rejected(1000, "closed before hello")
        try:
            hello = protocol.parse_runner_message(raw)
        except protocol.ProtocolError as e:
            await ws.send_text(protocol.encode(protocol.ErrorMsg(code=e.code, message=e.message)))
            raise _Rejected(1008, "the first frame must be a valid hello") from None
        if not isinstance(hello, protocol.Hello):
            await ws.send_text(
                protocol.encode(
                    protocol.ErrorMsg(code=ErrorCode.BAD_MESSAGE, message="the first frame must be hello",
                                      ref_type=hello.type)
                )
            )
            raise _Rejected(1008, "the first frame must be hello")
        if hello.protocol != protocol.PROTOCOL_VERSION:
            raise _Rejected(
                protocol.CLOSE_PROTOCOL_UNSUPPORTED,
                f"protocol {hello.protocol} unsupported; this server speaks {protocol.PROTOCOL_VERSION}",
            )
        old = self.conns.get(runner_id)
        if old is not None:
            await self._replace(old)
        session_id = uuid.uuid4().hex
        conn = _Conn(
            runner_id, name, session_id, ws, asyncio.Lock(), asyncio.Event(), time.monotonic(), len(hello.in_flight)
        )

        restore = self._restorer(runner_id, hello) if hello.restores else None

        def job(s: Session) -> tuple[str | None, Reconciled]:
            n = rows.record_hello(s, runner_id, session_id, hello)
            return n, reconcile_in_flight(s, runner_id, n or name, hello.in_flight, hello.in_flight_phases,
                                          restore)

        recorded, rec = await self.dbq.run(job)
        if recorded is None:
            raise _Rejected(protocol.CLOSE_TOKEN_REVOKED, "runner was deleted")
        self.conns[runner_id] = conn
        conn.reconciled = rec
        conn.status_acks = hello.status_acks
        conn.live_views = hello.live_views
        conn.task_holds = hello.task_holds
        conn.restores = hello.restores
        log.info("runner %s (%s) connected: %d slots, %d resumed, %d lost, %d going on from a save point", name,
                 runner_id, hello.slots, len(rec.resume), len(rec.lost), len(rec.restored))
        return conn

    async def _replace(self, old: _Conn) -> None:
        """Close a runner's older connection, and let it handle the frames it had already received before the
        new hello is reconciled: a runner that crashed and came back sent its last replay frames, statuses and
        results on the old socket, and they come before anything the new one says."""
        old.replaced = True
        deadline = time.monotonic() + REPLACED_DRAIN_S
        # Closing first would queue the disconnect ahead of frames still in the socket: wait until its reader
        # has waited a quiet spell with nothing come (a crashed runner's socket ends by itself).
        while not old.done.is_set() and time.monotonic() < deadline:
            before = old.frames_in if old.waiting else -1
            with contextlib.suppress(TimeoutError):
                await within(REPLACED_QUIET_S, old.done.wait())
            if old.waiting and old.frames_in == before:
                break
        await old.close(protocol.CLOSE_REPLACED, "another connection with this token took over")
        try:
            await within(max(0.0, deadline - time.monotonic()) + REPLACED_QUIET_S, old.done.wait())
        except TimeoutError:
            log.warning("runner %s: its replaced connection still handling frames after %g s; going on",
                        old.name, REPLACED_DRAIN_S)

    def _restorer(self, runner_id: str, hello: protocol.Hello) -> Callable[[Session, str], protocol.Lease | None]:
        """How an attempt this runner lost goes on from a save point it still holds (attempts/resume.py)."""
        held = {(h.start_state_id, h.version) for h in hello.start_states}
        script_timeout, policy = self._lease_terms()
        return lambda s, aid: resume_lease(s, aid, runner_id, held, script_timeout=script_timeout, policy=policy)

    def _lease_terms(self) -> tuple[float, SavePointPolicy]:
        """What a lease made here carries beside its case: the scheduler's script timeout and save points."""
        if self.scheduler is not None:
            return self.scheduler.script_timeout, self.scheduler.save_points
        return 600.0, SavePointPolicy(self.settings.save_point_minutes, self.settings.save_points_kept)

    async def _after_hello(self, conn: _Conn) -> None:
        """Welcome, then what the reconnect reconciliation asked for (part of the session: its failures
        end the session through the same cleanup as a disconnect)."""
        rec = conn.reconciled
        assert rec is not None
        runner_id = conn.runner_id
        await conn.send(
            protocol.Welcome(
                runner_id=runner_id,
                name=conn.name,
                heartbeat_interval=self.settings.heartbeat_interval,
                dead_after=self.settings.dead_after,
                resume=rec.resume,
                status_acks=conn.status_acks,
                save_points_told=True,
                not_here_refusals=True,
            )
        )
        for aid in rec.unwanted:
            await conn.send(protocol.Cancel(attempt_id=aid, reason=CancelReason.NOT_WANTED))
        for aid in rec.lost:
            self._task_over(aid)
        for lease in rec.restored:
            # The agent goes on (its clock back at the save point's task time) before the machine is
            # back: its requests meanwhile are answered as any while the runner is away.
            assert lease.restore is not None
            await self.agents.resumed(lease.attempt_id, lease.restore.save_point)
            await conn.send(lease)
            log.info("attempt %s goes on from save point %s (step %d) on runner %s", lease.attempt_id,
                     lease.restore.save_point.save_point_id, lease.restore.save_point.step, conn.name)
        for run in rec.runs:
            self.run_changed(run)
        # A task_end kept while the runner was away reaches an attempt that goes on from a save point too.
        late = await self.agents.resend_task_ends(runner_id, rec.resume + [lease.attempt_id for lease in rec.restored],
                                                  rec.in_task, rec.task_unheard)
        if conn.status_acks:
            # Every task in progress now has its agent or a task_end saying why not: the runner's
            # `running` is answered (a runner whose task reaches its limit unanswered calls it ours).
            for aid in rec.in_task:
                await conn.send(protocol.StatusAck(attempt_id=aid, status=AttemptStatus.RUNNING, phase="task",
                                                   late_seconds=late.get(aid)))
        await self._send_queued_jobs(conn)
        self.poke()

    async def _closed(self, conn: _Conn) -> None:
        if self.conns.get(conn.runner_id) is conn:
            del self.conns[conn.runner_id]
        # The holder reached the machine through this socket, and the runner lets its holds go with it; a
        # hold taken on the runner's newer connection (it reconnected before this close ran) is not this one's.
        self.takeovers.runner_gone(conn.runner_id, conn.session_id)
        for rid, sid, fut in list(self._pending.values()):
            if rid == conn.runner_id and sid == conn.session_id and not fut.done():
                fut.set_result(
                    protocol.MachineResponse(request_id="", ok=False, refusal=protocol.MachineRefusal.LINK_LOST,
                                             error="the runner disconnected before answering")
                )
        try:
            await self.dbq.run(lambda s: rows.record_disconnect(s, conn.runner_id, conn.session_id))
        except Exception:
            log.warning("could not record the disconnect of runner %s", conn.runner_id, exc_info=True)
        log.info("runner %s (%s) disconnected", conn.name, conn.runner_id)
        self.poke()

    @staticmethod
    async def _receive(ws: WebSocket) -> str | bytes | None:
        msg = await ws.receive()
        if msg["type"] == "websocket.disconnect":
            return None
        text = msg.get("text")
        if text is not None:
            return str(text)
        data = msg.get("bytes")
        return bytes(data) if data is not None else b""

    async def _heartbeats(self, conn: _Conn) -> None:
        interval = self.settings.heartbeat_interval
        while not conn.closed.is_set():
            await asyncio.sleep(interval)
            if not await conn.send(protocol.Heartbeat(at=utcnow())):
                return
            try:
                await self._touch(conn)
            except Exception:
                log.warning("could not record liveness of runner %s", conn.runner_id, exc_info=True)

    async def _touch(self, conn: _Conn) -> None:
        conn.last_db_seen = time.monotonic()
        paused = None if conn.paused is None else str(conn.paused)
        state = await self.dbq.run(lambda s: rows.touch(s, conn.runner_id, conn.session_id, conn.busy, paused))
        if state == "revoked":
            await conn.close(protocol.CLOSE_TOKEN_REVOKED, "runner token revoked")
        elif state == "replaced":
            await conn.close(protocol.CLOSE_REPLACED, "another connection with this token took over")

    async def _read(self, conn: _Conn) -> None:
        dead_after = self.settings.dead_after
        # Closed by us, it stops; replaced, it goes on to the disconnect that the close queued behind
        # the frames this socket had already received (_replace).
        while conn.replaced or not conn.closed.is_set():
            conn.waiting = True
            try:
                try:
                    async with timeout(dead_after):
                        raw = await self._receive(conn.ws)
                except TimeoutError:
                    # A loop held up past the bound (a loaded host) runs the timer and the frame that
                    # arrived meanwhile in one pass, and the timer may win; a cancelled receive keeps
                    # that frame queued. A frame already here is not silence: look once more, briefly.
                    async with timeout(LATE_FRAME_S):
                        raw = await self._receive(conn.ws)
            except TimeoutError:
                log.warning("runner %s silent for %g s: closing", conn.name, dead_after)
                await conn.close(protocol.CLOSE_HEARTBEAT_TIMEOUT, f"silent for {dead_after:g} s")
                return
            except Exception:  # the socket broke
                return
            conn.waiting = False
            conn.frames_in += 1
            if raw is None:
                return
            try:
                msg = protocol.parse_runner_message(raw)
            except protocol.ProtocolError as e:
                await conn.send(protocol.ErrorMsg(code=e.code, message=e.message))
                continue
            try:
                await self._dispatch(conn, msg)
            except Exception:
                log.exception("handling %s from runner %s failed", getattr(msg, "type", "?"), conn.name)
                await conn.send(
                    protocol.ErrorMsg(
                        code=ErrorCode.INTERNAL,
                        message="the server could not handle this frame; it was not applied",
                        ref_type=getattr(msg, "type", None),
                    )
                )

    async def _dispatch(self, conn: _Conn, msg: Any) -> None:
        rid = conn.runner_id
        if isinstance(msg, protocol.Heartbeat):
            if msg.busy is not None:
                conn.busy = msg.busy
            paused = not conn.leasable
            changed = msg.paused != conn.paused
            conn.draining = bool(msg.draining)
            conn.paused = msg.paused
            conn.refused_in_row = 0
            if changed:
                if msg.paused is not None:
                    log.warning("runner %s paused itself: %s", conn.name, msg.paused)
                else:
                    log.info("runner %s resumed", conn.name)
                await self._touch(conn)  # the runners list says so now, not at the next touch
            if paused and conn.leasable:
                self.poke()
        elif isinstance(msg, protocol.AttemptFinished):
            # Not the attempt's end: a report decided at the hello (it was resumed, and runs on), or the
            # cancelled copy of an attempt this runner handed off (it runs on elsewhere).
            if not msg.result.interrupted and not self._copy_handed_off(msg.result.attempt_id, rid):
                self._task_over(msg.result.attempt_id)
            await self.intake.receive(rid, conn.name, msg.result)
        elif isinstance(msg, protocol.AttemptStatus):
            new = await self.dbq.run(lambda s: apply_status(s, rid, msg))
            if new == AttemptStatus.RUNNING or (new is None and msg.status == AttemptStatus.RUNNING):
                await self.agents.on_running(rid, msg.attempt_id)
            elif msg.status in (AttemptStatus.CHECKING, AttemptStatus.DONE) and not self._copy_handed_off(
                    msg.attempt_id, rid):
                self._task_over(msg.attempt_id)
            if conn.status_acks:
                await conn.send(protocol.StatusAck(attempt_id=msg.attempt_id, status=msg.status, phase=msg.phase))
        elif isinstance(msg, protocol.MachineResponse):
            pending = self._pending.get(msg.request_id)
            if pending is not None and pending[0] == rid and not pending[2].done():
                pending[2].set_result(msg)
        elif isinstance(msg, protocol.ReplayFrame):
            try:
                png = base64.b64decode(msg.png_b64, validate=True)
            except (binascii.Error, ValueError):
                await conn.send(
                    protocol.ErrorMsg(
                        code=ErrorCode.BAD_MESSAGE, message="replay_frame: png_b64 is not base64",
                        ref_type=msg.type
                    )
                )
                return
            if not await self.dbq.run(lambda s: rows.store_frame(s, rid, msg, png)):
                await conn.send(
                    protocol.ErrorMsg(
                        code=ErrorCode.REFUSED,
                        ref_type=msg.type,
                        message=f"attempt {msg.attempt_id} is not leased to this runner",
                    )
                )
        elif isinstance(msg, protocol.LeaseAccept):
            conn.refused_in_row = 0  # the lease row is already `leased` to it; its statuses move it on
        elif isinstance(msg, protocol.LeaseRefuse):
            conn.refused_in_row += 1
            log.info("runner %s refused %r (%s): %r", conn.name, msg.attempt_id[:80], msg.code, msg.reason[:200])
            run = await self.dbq.run(lambda s: restore_refused(s, msg.attempt_id, rid, msg.reason))
            if run is not None:  # it was to go on from a save point: the error it would have been
                self._task_over(msg.attempt_id)
                self.run_changed(run)
            elif self.scheduler is not None:
                await self.scheduler.refused(msg.attempt_id, rid, msg.code)
            else:
                await self.dbq.run(lambda s: release_lease(s, msg.attempt_id, rid))
        elif isinstance(msg, protocol.SavePointMade):
            await self.dbq.run(lambda s: record_save_point(s, rid, msg))
        elif isinstance(msg, protocol.AttemptHandoff):
            await self._hand_off(conn, msg)
        elif isinstance(msg, protocol.JobResult):
            await self._job_result(conn, msg)
        elif isinstance(msg, protocol.ViewRefused):
            if self.on_view_refused is not None:
                self.on_view_refused(rid, msg)
        elif isinstance(msg, protocol.ErrorMsg):
            log.warning("runner %s reports %r: %r", conn.name, msg.code[:80], msg.message[:300])
        elif isinstance(msg, protocol.Hello):
            await conn.send(
                protocol.ErrorMsg(
                    code=ErrorCode.BAD_MESSAGE, message="hello was already received on this connection",
                    ref_type="hello"
                )
            )
        if time.monotonic() - conn.last_db_seen > self.settings.heartbeat_interval:
            await self._touch(conn)

    def _copy_handed_off(self, attempt_id: str, runner_id: str) -> bool:
        """Whether `runner_id` handed the attempt off (drain --migrate): what its cancelled copy reports is
        not the attempt's end, which runs on elsewhere."""
        return self._handed_off.get(attempt_id) == runner_id

    async def _hand_off(self, conn: _Conn, msg: protocol.AttemptHandoff) -> None:
        """A draining runner hands an attempt off (`gh-runner drain --migrate`): it goes on on another runner
        from the save point just pushed (attempts/resume.py), and this runner's copy is cancelled; with no
        runner to take it, it runs on here (the drain waits for it as for any attempt)."""
        rid, aid = conn.runner_id, msg.attempt_id
        others = [r for r in self.restoring_runner_ids() if r != rid]
        skip: Callable[[str, str], bool] = (self.scheduler.refusals if self.scheduler is not None
                                            else (lambda a, r: False))
        script_timeout, policy = self._lease_terms()

        def move(s: Session) -> tuple[str, protocol.Lease] | None:
            if not record_save_point(s, rid, protocol.SavePointMade(attempt_id=aid, save_point=msg.save_point)):
                return None  # not this runner's running attempt (any more)
            if not others:
                return None
            return resume_elsewhere(s, aid, others, skip, script_timeout=script_timeout, policy=policy)

        moved = await self.dbq.run(move)
        if moved is None:
            log.info("runner %s hands attempt %s off, but no other runner can take it now: it runs on there",
                     conn.name, aid)
            return
        self._handed_off[aid] = rid
        while len(self._handed_off) > 10_000:  # drained runners that never sent their copy's result
            self._handed_off.pop(next(iter(self._handed_off)))
        await self.resumed_elsewhere(*moved)
        await conn.send(protocol.Cancel(attempt_id=aid, reason=CancelReason.MIGRATED))

    async def _job_result(self, conn: _Conn, msg: protocol.JobResult) -> None:
        """The start-state service owns what a finished job means (status, version, webhook): its
        `apply_job_result(session, runner_id, msg)` runs here in the gateway's DB batch."""
        rid = conn.runner_id
        apply = self.apply_job_result
        await self.dbq.run(lambda s: apply(s, rid, msg))
        self.poke()  # a new held version can unblock queued attempts

    async def _send_queued_jobs(self, conn: _Conn) -> None:
        """Start-state jobs queued while the runner was away go out when it is back."""
        rid = conn.runner_id
        jobs = await self.dbq.run(lambda s: rows.queued_jobs(s, rid))
        for job_id, payload in jobs:
            try:
                msg = protocol.Job.model_validate(payload)
            except pydantic.ValidationError:
                log.warning("runner job %s has an invalid payload; not sent", job_id)
                continue
            if await conn.send(msg):
                await self.dbq.run(lambda s, jid=job_id: rows.mark_job_sent(s, jid))  # type: ignore[misc]


