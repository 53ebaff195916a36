"""What this runner offers: its images and the start-state versions it holds, as the provider last said.

The hello advertises it, admission checks leases against it, and it is asked again whenever it may
have changed: at every hello, when a lease names an image not listed (one may have been installed
since), after a pull, and after a start-state job that built, saved or deleted a version.
"""

from __future__ import annotations

import contextlib

from gh_common.timeouts import within
from gh_runner.log import get_logger
from gh_wire.protocol import StartStateRef
from providers.base import ImageInfo, MachineSource, Provider

PROVIDER_CALL_TIMEOUT = 300.0  # list_images/held_versions/reap on a loaded host


def source_of(ref: StartStateRef) -> MachineSource:
    """What a lease's or a job's start state names, as the provider's machine source."""
    if ref.kind == "state":
        return MachineSource(image=ref.image, start_state_id=ref.start_state_id, version=ref.version)
    return MachineSource(image=ref.image)


class Inventory:
    def __init__(self, provider: Provider) -> None:
        self._provider = provider
        self._log = get_logger("gh_runner.inventory")
        self.images: list[ImageInfo] = []
        self.held: list[tuple[str, int]] = []  # (start_state_id, version)

    def image(self, name: str) -> ImageInfo | None:
        return next((i for i in self.images if i.name == name), None)

    async def refresh(self) -> None:
        """Ask the provider again; what it cannot list is advertised as nothing (and logged)."""
        try:
            self.images = await within(PROVIDER_CALL_TIMEOUT, self._provider.list_images())
        except Exception as e:
            self._log.error("listing images failed; advertising none", error=str(e))
            self.images = []
        try:
            self.held = await within(PROVIDER_CALL_TIMEOUT, self._provider.held_versions())
        except Exception as e:
            self._log.error("listing start-state versions failed; advertising none", error=str(e))
            self.held = []

    async def now_held(self, version: tuple[str, int], pulled: bool) -> None:
        """`version` is held now; after a pull, the versions held are asked again (the cache may have
        evicted others to make room)."""
        if pulled:
            with contextlib.suppress(Exception):
                self.held = await within(PROVIDER_CALL_TIMEOUT, self._provider.held_versions())
        if version not in set(self.held):
            self.held.append(version)
