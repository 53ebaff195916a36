"""What keeps a guest's screen changing, for the benches of live views (bench/live_view.py,
bench/agent_step.py): a script per image, started in the guest in a session of its own and ended by its
process group.
"""

from __future__ import annotations

# The desktop's scripts run as its signed-in user, DISPLAY set (the image's way).
MOVERS: dict[str, dict[str, str]] = {
    "linux-tiny": {
        "a console printing `date` in a loop": "while :; do date; done > /dev/tty1 2>&1\n",
        "a console printing random hex": "exec od -An -tx1 /dev/urandom > /dev/tty1 2>&1\n",
    },
    "linux-desktop": {"a window moved every 50 ms": (
        "exec python3 - <<'EOF'\n"
        "import tkinter as tk\n"
        "root = tk.Tk()\n"
        "root.geometry('320x200+0+150')\n"
        "tk.Label(root, text='moving', bg='orange', font=('Sans', 32)).pack(fill='both', expand=True)\n"
        "def move(x=[0]):\n"
        "    x[0] = (x[0] + 8) % 900\n"
        "    root.geometry(f'+{x[0]}+150')\n"
        "    root.after(50, move)\n"
        "move()\n"
        "root.mainloop()\n"
        "EOF\n"
    )},
}


def start_script(mover: str) -> str:
    """A guest script that starts `mover` in the background and returns at once."""
    return (f"cat > /tmp/gh-mover.sh <<'GH_MOVER'\n{mover}GH_MOVER\n"
            "setsid sh /tmp/gh-mover.sh </dev/null >/dev/null 2>&1 &\n"
            "echo $! > /tmp/gh-mover.pid\n")


def stop_script() -> str:
    """A guest script that ends what start_script started (its process group)."""
    return 'kill -- -"$(cat /tmp/gh-mover.pid)"; rm -f /tmp/gh-mover.*\n'


__all__ = ["MOVERS", "start_script", "stop_script"]
