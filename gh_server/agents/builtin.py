"""The built-in agents: `noop` (does nothing) and `reference` (applies the case's known fix).

`noop` must fail and `reference` must pass every valid case: that is how a benchmark's cases are
validated (docs/agents.md, "Which agent a run uses"; gh_server/validation.py).
"""

from __future__ import annotations

from gh_server.agents.base import AgentContext, AgentError, AgentOutcome


class NoopAgent:
    async def run(self, ctx: AgentContext) -> AgentOutcome:
        return AgentOutcome(answer="")


class ReferenceAgent:
    """Runs `metadata.reference_fix` on the machine (elevated, via the runner), answers `metadata.reference_answer`."""

    async def run(self, ctx: AgentContext) -> AgentOutcome:
        meta = ctx.case.get("metadata") or {}
        fix = meta.get("reference_fix")
        answer = meta.get("reference_answer")
        steps = 0
        if fix is not None:
            if not isinstance(fix, str):
                raise AgentError("metadata.reference_fix must be a script (a string)")
            if fix.strip():
                # The fix gets the task's whole time budget; a fix that exits non-zero is still the
                # reference's doing and the check after judges it.
                await ctx.machine.exec(fix, timeout=min(3600.0, ctx.minutes * 60.0))
                steps = 1
        elif answer is None:
            raise AgentError("the reference agent needs metadata.reference_fix or metadata.reference_answer "
                             "in the test case")
        return AgentOutcome(answer="" if answer is None else str(answer), steps=steps)
