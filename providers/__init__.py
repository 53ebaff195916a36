"""Machine providers behind one small, hypervisor-neutral interface (see providers/base.py)."""
