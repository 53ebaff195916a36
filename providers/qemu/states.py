"""Where start-state versions live: state_dir/states/<start_state_id>/v<N>/{disk.qcow2,memory.img,meta.json}."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from providers.errors import ProviderError

_SSID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
DISK = "disk.qcow2"
MEMORY = "memory.img"
META = "meta.json"


@dataclass(frozen=True)
class VersionFiles:
    dir: Path

    @property
    def disk(self) -> Path:
        return self.dir / DISK

    @property
    def memory(self) -> Path:
        return self.dir / MEMORY

    @property
    def meta(self) -> Path:
        return self.dir / META

    def read_meta(self) -> dict[str, object]:
        try:
            data = json.loads(self.meta.read_text())
        except (OSError, ValueError):
            raise ProviderError(f"start-state version at {self.dir} is incomplete (no readable meta.json)") from None
        if not isinstance(data, dict):
            raise ProviderError(f"start-state version at {self.dir} has a corrupt meta.json")
        return data


class StateStore:
    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "states"

    def version(self, start_state_id: str, version: int) -> VersionFiles:
        if not _SSID.match(start_state_id) or start_state_id in (".", ".."):
            raise ProviderError(f"invalid start state id {start_state_id!r}")
        if not isinstance(version, int) or version < 0:
            raise ProviderError(f"invalid start state version {version!r}")
        return VersionFiles(self.root / start_state_id / f"v{version}")

    def existing(self, start_state_id: str, version: int) -> VersionFiles:
        v = self.version(start_state_id, version)
        if not v.meta.is_file() or not v.disk.is_file():
            raise ProviderError(f"start state {start_state_id} version {version} is not stored on this runner")
        return v

    def held(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        if not self.root.is_dir():
            return out
        for meta in self.root.glob("*/v*/" + META):
            m = re.fullmatch(r"v(\d+)", meta.parent.name)
            if m and (meta.parent / DISK).is_file():
                out.append((meta.parent.parent.name, int(m.group(1))))
        return sorted(out)

    def delete(self, start_state_id: str, version: int) -> None:
        v = self.version(start_state_id, version)
        if v.dir.exists():
            shutil.rmtree(v.dir)
        parent = v.dir.parent
        try:
            parent.rmdir()  # only when no other version is left
        except OSError:
            pass
