"""The errors a provider raises that the runner must know, and branch on.

Every provider method names, under `Raises:`, which of these it raises; nothing else escapes a
provider (libvirt's own errors become a `ProviderError` with a plain reason at the boundary).
"""

from __future__ import annotations

from enum import StrEnum


class ProviderError(Exception):
    """A plain, operator-readable reason something failed in the provider (no libvirt noise)."""


class HypervisorUnavailable(ProviderError):
    """The hypervisor does not answer (libvirtd stopped or restarting): nothing can be made, reached
    or destroyed until it does. Passes by itself; the runner pauses meanwhile."""


class MachineNotReady(ProviderError):
    """The guest channel did not answer before the deadline."""


class InputNotSupported(ProviderError):
    """An input event the provider cannot deliver (for example a character outside the keymap)."""


class NoScreenStream(ProviderError):
    """The machine has no screen stream to open (a provider without one, or a domain made without
    its display): a live view of it cannot be had, the machine itself is fine."""


class NoAccessibilityTree(ProviderError):
    """The machine has no accessibility tree to read: no signed-in desktop session (a console image),
    or no AT-SPI bus or reader in it. The machine itself is fine."""


class AccessibilityTooLarge(ProviderError):
    """The accessibility tree is over the size cap of the read."""


class MachineLimit(StrEnum):
    """Which of the runner's limits a machine went over."""

    DISK_WRITE_CAP = "disk_write_cap"


class MachineLimitExceeded(ProviderError):
    """The machine was stopped because it went over one of the runner's limits (`limit` says which);
    every later call on it raises this again."""

    def __init__(self, limit: MachineLimit, message: str) -> None:
        super().__init__(message)
        self.limit = limit


__all__ = ["AccessibilityTooLarge", "HypervisorUnavailable", "InputNotSupported", "MachineLimit",
           "MachineLimitExceeded", "MachineNotReady", "NoAccessibilityTree", "NoScreenStream", "ProviderError"]
