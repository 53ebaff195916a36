"""A slow link in front of a real registry: a loopback TCP proxy that passes the registry's answers at
a fixed rate (requests go through at once). What a registry across a thin WAN link looks like to a
runner, without touching the registry itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

CHUNK = 16 * 1024


class SlowLink:
    def __init__(self, upstream_port: int, bytes_per_s: float) -> None:
        self.upstream_port = upstream_port
        self.bytes_per_s = bytes_per_s
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        for pump in (self._pump(client_r, up_w, None), self._pump(up_r, client_w, self.bytes_per_s)):
            task = asyncio.create_task(pump)
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, rate: float | None) -> None:
        free_at = time.monotonic()  # when the link has carried what was sent (no credit saved while idle)
        try:
            while data := await src.read(CHUNK):
                dst.write(data)
                await dst.drain()
                if rate is not None:
                    # Pacing, not synchronisation: the link carries `rate` bytes a second.
                    free_at = max(free_at, time.monotonic()) + len(data) / rate
                    await asyncio.sleep(max(0.0, free_at - time.monotonic()))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                dst.close()
