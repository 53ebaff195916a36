"""The process helpers of the end-to-end tests themselves (no libvirt, no server)."""

from __future__ import annotations

from pathlib import Path

from kit.net import free_port

from .procs import RestartableServer, ephemeral_ports


def test_a_restartable_server_gets_a_port_no_outgoing_connection_can_take(tmp_path: Path) -> None:
    # While a killed gh-server is down, the kernel may hand its port to any outgoing loopback
    # connection if the port is ephemeral; the restart then exits 2 (address in use).
    # bench/faults.py saw that once (a restart "exited 2 three seconds after the kill").
    assert free_port() in ephemeral_ports()  # why RestartableServer cannot use it
    ports = {RestartableServer(tmp_path, tmp_path / "c.yaml", tmp_path / "log").port for _ in range(20)}
    assert not [p for p in ports if p in ephemeral_ports()], ports
