"""The HTTP machine API external agents use on their attempt's machine (docs/agents.md).

`Authorization: Bearer <token>`: the per-attempt token from the agent's request document. It works
only while the attempt's task runs (the supervisor drops it when the agent ends or is stopped). Grants
are rows, so any gh-server process behind a load balancer answers; the machine request itself goes to
the runner through whichever process holds its websocket (gateway.machine_request).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gh_server.agents import machine_limits
from gh_server.agents.base import MachineError, TaskStopped
from gh_server.agents.supervisor import MACHINE_API_PATH, Grant
from gh_wire.answer import GuestText
from gh_wire.input import InputEvent
from gh_wire.protocol import MachineRefusal

if TYPE_CHECKING:
    from gh_server.agents.supervisor import AgentSupervisor


class ActionNote(BaseModel):
    """What an agent says of the action it sends, put on the action's replay frame as the built-in model
    agent's notes are (gh_server/agents/model/loop.py): its step, its words, the action as it wrote it."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0, le=1_000_000)
    text: GuestText = Field(default="", max_length=8_000)
    action: GuestText = Field(default="", max_length=2_000)

    def as_note(self) -> dict[str, Any]:
        return {"agent": "external", **self.model_dump()}


class InputBody(BaseModel):
    events: list[InputEvent] = Field(min_length=1, max_length=machine_limits.EVENTS_MAX)
    note: ActionNote | None = None


class ExecBody(BaseModel):
    script: GuestText = Field(min_length=1, max_length=100_000)
    env: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=120.0, gt=0, le=3600)
    note: ActionNote | None = None

    _env = field_validator("env")(classmethod(lambda cls, v: machine_limits.check_env(v)))


class AskBody(BaseModel):
    question: GuestText = Field(min_length=1, max_length=8_000)


class ApprovalBody(BaseModel):
    request: GuestText = Field(min_length=1, max_length=8_000, description="what the agent asks leave to do")


def _error(status: int, etype: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"type": etype, "message": message, **extra}}, status_code=status)


async def _machine_failed(sup: AgentSupervisor, grant: Grant, e: MachineError, stepped: bool = True) -> JSONResponse:
    """A refused request: 409 when the task was stopped (the agent's end), or with code `taken_over` when
    a person held the machine while it waited, or `machine_restored` when the machine went back to a save
    point after its runner was lost (not done, and no step spent: look again); 503 `link_lost` when the
    runner's link went before it answered (not known whether done: look again) and 502 `machine_away` when
    the runner stayed away (both ours); 413 when it is too large to
    relay over the runner's websocket (the caller's request, or what it asked for, is what to change);
    for the accessibility tree 422 `no_accessibility` (no desktop), 413 `accessibility_too_large`, 503
    `accessibility_timeout` (none counts against the agent or as the machine's failure);
    400 for an input event the machine cannot deliver (an unknown key name); 422 when the caller's own
    exec broke the guest channel (the guest still runs); 502 when the machine failed
    under the agent, remembered so that an agent which then gives up is our error, not its failure."""
    if isinstance(e, TaskStopped):
        return _error(409, "conflict", str(e))
    if e.refusal == MachineRefusal.TAKEN_OVER:
        if stepped:  # a screen spends none (it is refused so only when the holder kept turning it back)
            await sup.give_back_step(grant)
        return _error(409, "conflict", str(e), code=MachineRefusal.TAKEN_OVER.value)
    if e.refusal == MachineRefusal.RESTORED:  # the machine went back to a save point: not done, look again
        if e.save_point is not None:  # the steps after it (this one too) were undone by our fault, not spent
            await sup.steps_back_to(grant, e.save_point.step)
        elif stepped:
            await sup.give_back_step(grant)
        return _error(409, "conflict", str(e), code=MachineRefusal.RESTORED.value)
    if e.refusal == MachineRefusal.LINK_LOST:  # ours: whether it was done is not known; look again
        await sup.machine_failed(grant, str(e))
        return _error(503, "server_error", str(e), code=MachineRefusal.LINK_LOST.value)
    if e.refusal in (MachineRefusal.AWAY, MachineRefusal.NOT_HERE):  # ours: away past its grace, or no lease came
        await sup.machine_failed(grant, str(e))
        return _error(502, "server_error", str(e), code=e.refusal.value)
    if e.refusal == MachineRefusal.INPUT_NOT_SUPPORTED:
        return _error(400, "invalid_request", str(e))
    if e.refusal == MachineRefusal.NO_ACCESSIBILITY:  # the image has no desktop: what was asked cannot be had
        return _error(422, "invalid_request", str(e), code=e.refusal.value)
    if e.refusal == MachineRefusal.ACCESSIBILITY_TOO_LARGE:
        return _error(413, "invalid_request", str(e), code=e.refusal.value)
    if e.refusal == MachineRefusal.ACCESSIBILITY_TIMEOUT:  # the desktop's applications were slow: not a failure
        return _error(503, "server_error", str(e), code=e.refusal.value)
    if e.refusal == MachineRefusal.CHANNEL_LOST_IN_EXEC:  # its own script broke the channel: not ours
        return _error(422, "invalid_request", str(e))
    if e.refusal is not None:
        return _error(413, "invalid_request", str(e))
    await sup.machine_failed(grant, str(e))  # on the grant's row: the agent may run in another process
    return _error(502, "server_error", str(e))


def router(sup: AgentSupervisor) -> APIRouter:
    r = APIRouter(prefix=MACHINE_API_PATH, include_in_schema=True, tags=["agent machine API"])

    async def grant_of(request: Request) -> Grant | JSONResponse:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        grant = await sup.grant_for(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
        if grant is None:
            return _error(401, "authentication", "no such machine token, or the attempt's task is over")
        return grant

    async def step(grant: Grant) -> JSONResponse | None:
        counted = await sup.take_step(grant)  # in the grants table: the limit holds across processes;
        # a refused step ends the task (take_step flags the row, the supervisor running the agent stops it)
        if counted is None:
            return _error(401, "authentication", "no such machine token, or the attempt's task is over")
        if not counted:
            return _error(409, "conflict", f"the case's step limit ({grant.max_steps}) is reached")
        return None

    async def body(request: Request, model: type[BaseModel]) -> Any:
        try:
            return model.model_validate(await request.json())
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            return _error(400, "invalid_request", f"{where}: {first.get('msg')}")
        except ValueError:
            return _error(400, "invalid_request", "the body must be JSON")

    async def granted_body(request: Request, model: type[BaseModel]) -> tuple[Grant, Any] | JSONResponse:
        """The request's grant and its validated body, or the error to answer with."""
        grant = await grant_of(request)
        if isinstance(grant, JSONResponse):
            return grant
        b = await body(request, model)
        if isinstance(b, JSONResponse):
            return b
        return grant, b

    @r.get("/screen", response_class=Response, responses={200: {"content": {"image/png": {}}}})
    async def screen(request: Request) -> Response:
        grant = await grant_of(request)
        if isinstance(grant, JSONResponse):
            return grant
        try:
            png = await grant.machine.screen()
        except MachineError as e:
            return await _machine_failed(sup, grant, e, stepped=False)
        return Response(png, media_type="image/png")

    @r.get("/accessibility", response_class=Response, responses={200: {"content": {"application/xml": {}}}})
    async def accessibility(request: Request) -> Response:
        """The signed-in session's AT-SPI tree as XML in OSWorld's form (docs/desktop-guests.md). A look,
        like the screen: no step is spent."""
        grant = await grant_of(request)
        if isinstance(grant, JSONResponse):
            return grant
        try:
            xml = await grant.machine.accessibility()
        except MachineError as e:
            return await _machine_failed(sup, grant, e, stepped=False)
        return Response(xml, media_type="application/xml")

    @r.post("/input")
    async def send_input(request: Request) -> Response:
        got = await granted_body(request, InputBody)
        if isinstance(got, JSONResponse):
            return got
        grant, b = got
        if (limited := await step(grant)) is not None:
            return limited
        try:
            await grant.machine.input(b.events, note=b.note.as_note() if b.note else None)
        except MachineError as e:
            return await _machine_failed(sup, grant, e)
        return JSONResponse({"ok": True})

    @r.post("/exec")
    async def run_exec(request: Request) -> Response:
        got = await granted_body(request, ExecBody)
        if isinstance(got, JSONResponse):
            return got
        grant, b = got
        if (limited := await step(grant)) is not None:
            return limited
        try:
            res = await grant.machine.exec(b.script, b.env, b.timeout,
                                           note=b.note.as_note() if b.note else None)
        except MachineError as e:
            return await _machine_failed(sup, grant, e)
        return JSONResponse(res.as_dict())

    @r.post("/save_point")
    async def save_point(request: Request) -> Response:
        """Save the machine (disk and memory) without ending the task; no step is spent."""
        grant = await grant_of(request)
        if isinstance(grant, JSONResponse):
            return grant
        try:
            point = await grant.machine.save_point()
        except MachineError as e:
            return await _machine_failed(sup, grant, e, stepped=False)
        return JSONResponse(point.model_dump(mode="json"))

    @r.post("/ask")
    async def ask(request: Request) -> Response:
        got = await granted_body(request, AskBody)
        if isinstance(got, JSONResponse):
            return got
        grant, b = got
        from gh_server.agents.base import AgentError

        try:
            answer = await sup.ask(grant, b.question)
        except AgentError as e:
            return _error(503, "server_error", str(e))
        return JSONResponse({"answer": answer, "simulated": True})

    @r.post("/approval")
    async def approval(request: Request) -> Response:
        got = await granted_body(request, ApprovalBody)
        if isinstance(got, JSONResponse):
            return got
        grant, b = got
        return JSONResponse({"decision": await sup.approve(grant, b.request), "simulated": True})

    return r
