"""The result says how the attempt's machine was made: the provider's `Machine.origin`."""

from __future__ import annotations

import pytest

from gh_runner.attempt import Attempt
from gh_runner.config import Timeouts
from gh_wire.protocol import TaskEnd
from providers.base import MachineOrigin

from .fakes import FakeLink, FakeProvider, make_lease

FAST = Timeouts(machine=5, ready=5, setup=5, check=5, task_grace=0.3, screen=5, teardown=5)


@pytest.mark.parametrize("origin", list(MachineOrigin))
async def test_result_metrics_name_the_machines_origin(provider: FakeProvider, link: FakeLink,
                                                       origin: MachineOrigin) -> None:
    provider.origin = origin
    a = Attempt(make_lease(setup=None), provider, link, FAST)
    a.task_end(TaskEnd(attempt_id="at_test1"))
    result = await a.run()
    assert result.metrics.machine_origin == origin.value


async def test_no_machine_no_origin(provider: FakeProvider, link: FakeLink) -> None:
    provider.create_error = "disk full"
    result = await Attempt(make_lease(), provider, link, FAST).run()
    assert result.outcome == "error" and result.metrics.machine_origin is None
