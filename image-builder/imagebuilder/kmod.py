"""Kernel modules from an extracted kernel package: find them, order them by dependency, copy
them uncompressed (busybox insmod loads plain .ko files; Debian may ship .ko.xz or .ko.zst)."""

from __future__ import annotations

import lzma
import re
from dataclasses import dataclass
from pathlib import Path

from . import proc
from .errors import BuildError

_SUFFIXES = (".ko", ".ko.xz", ".ko.zst")
_DEPENDS = re.compile(rb"(?:^|\x00)depends=([^\x00]*)\x00")


def norm(name: str) -> str:
    return name.replace("-", "_")


def _base(path: Path) -> str:
    name = path.name
    for s in _SUFFIXES:
        if name.endswith(s):
            return norm(name[: -len(s)])
    return norm(name)


_SIG_MARKER = b"~Module signature appended~\n"


def strip_signature(data: bytes) -> bytes:
    """Drop an appended module signature: the kernel then skips the RSA check on load (it only
    notes an unsigned module once, unless signatures are enforced, which Debian's are not)."""
    if not data.endswith(_SIG_MARKER):
        return data
    body = data[: -len(_SIG_MARKER)]
    # struct module_signature: 12 bytes ending in the big-endian signature length
    sig_len = int.from_bytes(body[-4:], "big")
    end = len(body) - 12 - sig_len
    return data[:end] if end > 0 else data


def read_module(path: Path) -> bytes:
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        return lzma.decompress(data)
    if path.name.endswith(".zst"):
        return proc.run(["zstd", "-dc"], input_bytes=data, timeout=60).stdout
    return data


@dataclass
class ModuleTree:
    """The modules of one kernel version under <root>/lib/modules/<kver>."""

    base: Path
    index: dict[str, Path]
    builtin: set[str]

    @classmethod
    def load(cls, extracted_root: Path, kver: str) -> ModuleTree:
        base = extracted_root / "lib" / "modules" / kver
        if not base.is_dir():
            base = extracted_root / "usr" / "lib" / "modules" / kver
        if not base.is_dir():
            raise BuildError(f"no modules for kernel {kver} in the kernel package")
        index = {_base(p): p for p in base.rglob("*.ko*") if p.name.endswith(_SUFFIXES)}
        builtin = set()
        bf = base / "modules.builtin"
        if bf.is_file():
            builtin = {_base(Path(line)) for line in bf.read_text().split()}
        return cls(base, index, builtin)

    def available(self, wanted: list[str], optional: set[str]) -> list[str]:
        """`wanted` minus the optional modules this kernel neither ships nor builds in."""
        return [w for w in wanted if norm(w) in self.index or norm(w) in self.builtin or norm(w) not in optional]

    def depends(self, name: str) -> list[str]:
        m = _DEPENDS.search(read_module(self.index[name]))
        if not m or not m.group(1):
            return []
        return [norm(d) for d in m.group(1).decode().split(",") if d]

    def load_order(self, wanted: list[str], already: set[str] | None = None) -> list[str]:
        """Module names in an order insmod accepts: each after its dependencies, otherwise as asked.
        Built-in modules and those in `already` (loaded earlier, e.g. by the initramfs) are skipped."""
        done = set(already or ())
        order: list[str] = []

        def visit(name: str, chain: tuple[str, ...]) -> None:
            if name in done or name in self.builtin:
                return
            if name not in self.index:
                raise BuildError(f"kernel module {name} is neither in the kernel package nor built in")
            if name in chain:
                raise BuildError(f"module dependency cycle: {' -> '.join((*chain, name))}")
            for dep in self.depends(name):
                visit(dep, (*chain, name))
            done.add(name)
            order.append(name)

        for w in wanted:
            visit(norm(w), ())
        return order

    def install(self, names: list[str], dest: Path, *, unsigned: bool = False) -> list[str]:
        """Copy modules uncompressed under dest keeping their relative paths; returns those paths."""
        rels = []
        for name in names:
            src = self.index[name]
            rel = src.relative_to(self.base).as_posix()
            for s in (".xz", ".zst"):
                rel = rel.removesuffix(s)
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            data = read_module(src)
            out.write_bytes(strip_signature(data) if unsigned else data)
            rels.append(rel)
        return rels
