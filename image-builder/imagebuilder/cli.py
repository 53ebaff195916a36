"""`image-builder/build NAME --out DIR`: the one entry point for every image."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .debs import DEFAULT_CACHE, DebCache
from .errors import BuildError
from .pipeline import build_lock


def _display(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT, e.g. 1280x800") from None
    if not (640 <= w <= 3840 and 480 <= h <= 2160):
        raise argparse.ArgumentTypeError(f"{text!r}: width 640-3840 and height 480-2160, please")
    return w, h


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="image-builder/build", description="Build a gh-runner image into DIR/NAME/.")
    p.add_argument("name", choices=["linux-tiny", "linux-desktop", "osworld-desktop", "windows-10"],
                   help="which image to build")
    p.add_argument("--out", required=True, type=Path, help="images directory (the runner's --images-dir)")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"download cache (default {DEFAULT_CACHE})")
    p.add_argument("--force", action="store_true", help="rebuild even when the inputs are unchanged")
    p.add_argument("--kernel", choices=["cloud", "generic"], default="cloud",
                   help="linux-tiny: Debian kernel flavour; cloud boots fast but has no USB, so its "
                   "tablet is virtio (default cloud)")
    p.add_argument("--display", type=_display, default=None, metavar="WxH",
                   help="linux-desktop, osworld-desktop: the screen size the session is set to (default 1280x800)")
    p.add_argument("--files-dir", type=Path, default=None, metavar="DIR",
                   help="osworld-desktop: the importer's files (DIR/sha256/<hex>) to put in the image's file "
                   "store, /usr/share/gh-osworld/files (default: an empty store)")
    p.add_argument("--iso", type=Path, help="windows-10: the Windows 10 22H2 installer ISO")
    p.add_argument("--virtio-iso", type=Path, help="windows-10: the virtio-win driver ISO")
    p.add_argument("--sysprep", action="store_true", help="windows-10: generalize the image with sysprep")
    p.add_argument("--dry-run", action="store_true",
                   help="windows-10: print the VM definition and the steps, build nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.name == "linux-tiny":
            from . import linux_tiny

            out = args.out.absolute()
            with build_lock(out, linux_tiny.NAME):
                linux_tiny.build(out, DebCache(args.cache), kernel_flavour=args.kernel, force=args.force)
        elif args.name == "linux-desktop":
            from . import linux_desktop

            out = args.out.absolute()
            with build_lock(out, linux_desktop.NAME):
                linux_desktop.build(out, DebCache(args.cache), display=args.display or linux_desktop.DEFAULT_DISPLAY,
                                    force=args.force)
        elif args.name == "osworld-desktop":
            from . import linux_desktop, osworld_desktop

            out = args.out.absolute()
            with build_lock(out, osworld_desktop.NAME):
                linux_desktop.build(out, DebCache(args.cache), display=args.display or linux_desktop.DEFAULT_DISPLAY,
                                    force=args.force, profile=osworld_desktop.profile(args.files_dir))
        else:
            from . import windows10

            return windows10.main(args)
    except BuildError as e:
        print(f"image-builder: {args.name}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("image-builder: interrupted", file=sys.stderr)
        return 130
    return 0
