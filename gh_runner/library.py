"""The runner's side of the shared library of start states: push what it saves, pull what it lacks.

- `publish(ssid, version)`: after a save, the version goes to the registry as an OCI artifact
  (gh_runner.artifacts); the job result carries the reference, so the server can lease the version
  to any runner with a registry and the base image.
- `acquire(lease)`: before a lease on a version this runner does not hold is accepted, the version is
  pulled: one pull per version however many leases wait on it (they share one task), each blob
  verified while it streams, staged under `state_dir/fetch/` and moved into the provider's store
  only when whole (`Provider.import_version`). Faults become `FetchRefused` with a typed
  `LeaseRefusal`, so the daemon refuses the lease and the server offers it to a holder or waits:
  a registry outage is never an attempt's error verdict.
- the cache: versions pulled here are remembered in `state_dir/registry-cache.json` with their size
  and last use; before a pull, least recently used ones not in use (no attempt holds them) are
  deleted until the new one fits in `cache_mib`. Versions this runner saved itself are the server's
  to delete, never evicted here.

Why the pull comes before the accept (its time still reported as the attempt's `fetch` phase): once
accepted, a failure could only be reported as a result, and a registry fault must be a refusal that
sends the attempt elsewhere, never an error verdict.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from gh_common.timeouts import timeout as bounded
from gh_runner import artifacts
from gh_runner.config import Registry as RegistrySettings
from gh_runner.registry import (
    DigestMismatch,
    NotFound,
    Registry,
    RegistryAuthError,
    RegistryError,
    RegistryTimeouts,
    RegistryUnavailable,
    load_credentials,
    transfer_bound,
)
from gh_wire.protocol import LeaseRefusal
from providers.base import Provider, ProviderError

log = structlog.get_logger("gh_runner.library")

MIB = 1024 * 1024
INDEX = "registry-cache.json"
FETCH_DIR = "fetch"


class FetchRefused(Exception):
    """A version could not be pulled; `code` is the typed refusal the daemon sends with the lease."""

    def __init__(self, code: LeaseRefusal, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class LibraryTimeouts:
    """A pull or push of a whole version is bounded by its floor here plus its bytes at the configured
    `registry.min_mib_per_s` (`registry.transfer_bound`): 60 s + 10 s for a 50 MiB state, 1 h 43 min for a
    30 GiB Windows one at the default 5 MiB/s."""

    check: float = 10.0  # the manifest look-up that decides whether a pull can start
    pull: float = 60.0  # a whole version (every blob): the floor
    push: float = 60.0  # the floor


def open_registry(settings: RegistrySettings, timeouts: RegistryTimeouts | None = None) -> Registry:
    """A client for the configured registry (each blob bounded at the configured rate, unless `timeouts`).

    Raises:
        RegistryError: the credentials file cannot be read or has no entry for this registry.
    """
    creds = load_credentials(settings.credentials_file, settings.url) if settings.credentials_file else None
    timeouts = timeouts or RegistryTimeouts(min_mib_per_s=settings.min_mib_per_s)
    return Registry(settings.url, credentials=creds, ca_file=settings.ca_file, timeouts=timeouts)


class Library:
    def __init__(self, provider: Provider, registry: Registry, settings: RegistrySettings, state_dir: Path,
                 timeouts: LibraryTimeouts | None = None) -> None:
        self.provider = provider
        self.registry = registry
        self.prefix = settings.repository
        self.cache_bytes = settings.cache_mib * MIB
        self.t = timeouts or LibraryTimeouts()
        self.min_mib_per_s = settings.min_mib_per_s
        self._index_path = state_dir / INDEX
        self._fetch_dir = state_dir / FETCH_DIR
        self._pulls: dict[tuple[str, int], asyncio.Task[float]] = {}
        self._in_use: Counter[tuple[str, int]] = Counter()
        self._index: dict[str, dict[str, float]] = self._load_index()
        # The registry refused our credentials at start: a configuration fault that waiting does not
        # mend, so the runner does not offer to pull (hello.registry unset) until it is restarted.
        self.auth_failed = False
        self.pulls_done = 0  # versions actually pulled (a test and the bench read it)
        self.last_pull: dict[str, float] = {}  # bytes, seconds and its steps (manifest, blobs, import)
        self.bytes_pulled = 0

    async def close(self) -> None:
        for task in self._pulls.values():
            task.cancel()
        await self.registry.close()

    # -- start-up ------------------------------------------------------------------------------

    async def check(self) -> str | None:
        """Reach the registry with our credentials; a sentence for the operator when that fails."""
        try:
            await self.registry.ping()
        except RegistryAuthError as e:
            self.auth_failed = True
            return f"registry {self.registry.url} refused the credentials: {e}; run `gh-runner doctor`"
        except RegistryError as e:
            return f"registry {self.registry.url} is not usable now: {e}"
        return None

    # -- push ----------------------------------------------------------------------------------

    async def publish(self, start_state_id: str, version: int, image_version: str | None = None) -> str:
        """Push a held version; returns its reference (host/repo@digest).

        Raises:
            RegistryError, ProviderError, TimeoutError.
        """
        bundle = await self.provider.export_version(start_state_id, version)
        size = await asyncio.to_thread(lambda: sum(p.stat().st_size for p in bundle.files.values()))
        started = time.monotonic()
        async with bounded(self.push_bound(size)):
            pushed = await artifacts.push_files(
                self.registry, artifacts.state_repo(self.prefix), artifacts.state_tag(start_state_id, version),
                bundle.files, artifacts.STATE_ARTIFACT,
                artifacts.state_annotations(start_state_id, version, bundle.image, image_version,
                                            bundle.image_checksum))
        log.info("start state pushed", start_state_id=start_state_id, version=version, ref=pushed.ref,
                 bytes=pushed.bytes, seconds=round(time.monotonic() - started, 2))
        return pushed.ref

    # -- pull on demand ------------------------------------------------------------------------

    async def acquire(self, start_state_id: str, version: int, image: str, image_checksum: str | None,
                      held: bool | None = None) -> float:
        """Mark the version in use (until `release`), pulling it first when it is not held here;
        returns the seconds this caller waited for the pull (0 when it was held). `held` None: the
        provider is asked, after the mark, so an eviction cannot slip between the look and the use.

        Raises:
            FetchRefused: the version cannot be had from the registry now (typed reason).
        """
        key = (start_state_id, version)
        self._in_use[key] += 1
        try:
            if held is None:
                held = key in set(await self.provider.held_versions())
            if held:
                self._touch(key)
                return 0.0
            started = time.monotonic()
            task = self._pulls.get(key)
            if task is None:
                task = asyncio.create_task(self._pull(start_state_id, version, image, image_checksum),
                                           name=f"pull-{start_state_id}.v{version}")
                self._pulls[key] = task
                task.add_done_callback(functools.partial(self._pull_done, key))
            # shield: one waiter's lease being cancelled must not cancel the pull the others wait on
            await asyncio.shield(task)
            return round(time.monotonic() - started, 3)
        except BaseException:
            self.release(start_state_id, version)
            raise

    def _pull_done(self, key: tuple[str, int], task: asyncio.Task[float]) -> None:
        if self._pulls.get(key) is task:
            del self._pulls[key]
        if not task.cancelled():
            task.exception()  # retrieved here: every waiter got it already (or none is left to)

    def release(self, start_state_id: str, version: int) -> None:
        key = (start_state_id, version)
        self._in_use[key] -= 1
        if self._in_use[key] <= 0:
            del self._in_use[key]
        self._touch(key)

    def in_use(self, start_state_id: str, version: int) -> bool:
        return self._in_use.get((start_state_id, version), 0) > 0

    async def _pull(self, ssid: str, version: int, image: str, image_checksum: str | None) -> float:
        where = f"start state {ssid} v{version}"
        staged = self._fetch_dir / f"{ssid}.v{version}"
        started = time.monotonic()
        try:
            async with bounded(self.t.check):
                manifest = await artifacts.state_manifest(self.registry, self.prefix, ssid, version)
            want = manifest.annotations.get(artifacts.A_IMAGE_CHECKSUM)
            if manifest.annotations.get(artifacts.A_IMAGE) != image or (image_checksum and want != image_checksum):
                raise FetchRefused(LeaseRefusal.IMAGE_MISSING,
                                   f"{where} in the registry was saved over image "
                                   f"{manifest.annotations.get(artifacts.A_IMAGE)} {str(want)[:19]}, which is not "
                                   "the image here")
            size = sum(d.size for d in manifest.layers)
            await self._make_room(size)
            await asyncio.to_thread(shutil.rmtree, staged, True)  # a pull cut short by a crash
            await asyncio.to_thread(self._fetch_dir.mkdir, parents=True, exist_ok=True)
            blobs_started = time.monotonic()
            bound = self.pull_bound(size)
            try:
                async with bounded(bound):
                    await artifacts.pull_files(self.registry, artifacts.state_repo(self.prefix), manifest, staged)
            except TimeoutError:
                raise RegistryUnavailable(
                    f"{size / MIB:.1f} MiB did not arrive within {bound:.1f} s (a floor of {self.t.pull:g} s "
                    f"plus the size at registry.min_mib_per_s = {self.min_mib_per_s:g})") from None
            import_started = time.monotonic()
            held_bytes = await self.provider.import_version(ssid, version, staged)
            steps = {"manifest": blobs_started - started, "blobs": import_started - blobs_started,
                     "import": time.monotonic() - import_started}
        except FetchRefused:
            raise
        except DigestMismatch as e:
            log.error("pulled blob does not match its digest; nothing kept", start_state_id=ssid, version=version,
                      expected=e.expected, actual=e.actual)
            raise FetchRefused(LeaseRefusal.REGISTRY_INVALID, f"{where}: {e}") from None
        except NotFound:
            raise FetchRefused(LeaseRefusal.VERSION_MISSING,
                               f"{where} is neither held here nor in the registry") from None
        except artifacts.ArtifactInvalid as e:
            raise FetchRefused(LeaseRefusal.REGISTRY_INVALID, f"{where}: {e}") from None
        except (RegistryUnavailable, RegistryAuthError, TimeoutError) as e:
            log.warning("registry unavailable for a pull", start_state_id=ssid, version=version,
                        error=str(e) or type(e).__name__)
            raise FetchRefused(LeaseRefusal.REGISTRY_UNAVAILABLE,
                               f"{where}: registry unavailable: {str(e) or 'timed out'}") from None
        except RegistryError as e:
            raise FetchRefused(LeaseRefusal.REGISTRY_UNAVAILABLE, f"{where}: {e}") from None
        except ProviderError as e:  # the files did not fit this runner (its image was checked above)
            raise FetchRefused(LeaseRefusal.START_FAILED, f"{where}: {e}") from None
        finally:
            await asyncio.to_thread(shutil.rmtree, staged, True)
        seconds = time.monotonic() - started
        self.pulls_done += 1
        self.bytes_pulled += size
        self.last_pull = {"bytes": float(size), "seconds": seconds, **steps}
        self._index[f"{ssid}/{version}"] = {"bytes": float(held_bytes), "used": time.time()}
        await asyncio.to_thread(self._save_index)
        log.info("start state pulled", start_state_id=ssid, version=version, bytes=size,
                 seconds=round(seconds, 3), **{k + "_s": round(v, 3) for k, v in steps.items()},
                 blob_mib_per_s=round(size / MIB / max(steps["blobs"], 1e-6), 1))
        return seconds

    def push_bound(self, size_bytes: int) -> float:
        """Seconds a push of `size_bytes` is given (`publish` bounds itself so)."""
        return transfer_bound(self.t.push, size_bytes, self.min_mib_per_s)

    def pull_bound(self, size_bytes: int) -> float:
        """Seconds the blobs of a version of `size_bytes` (from its manifest) are given before the pull
        is refused as `registry_unavailable`."""
        return transfer_bound(self.t.pull, size_bytes, self.min_mib_per_s)

    # -- the cache -----------------------------------------------------------------------------

    def _touch(self, key: tuple[str, int]) -> None:
        entry = self._index.get(f"{key[0]}/{key[1]}")
        if entry is not None:
            entry["used"] = time.time()  # saved with the next pull; a lost touch only ages an entry

    async def _make_room(self, need: int) -> None:
        """Evict least recently used pulled versions not in use until `need` more bytes fit."""
        held = set(await self.provider.held_versions())
        for name in [n for n in self._index if _key(n) not in held]:  # deleted by the server: forget it
            del self._index[name]
        total = sum(int(e["bytes"]) for e in self._index.values())
        for name, entry in sorted(self._index.items(), key=lambda kv: kv[1]["used"]):
            if total + need <= self.cache_bytes:
                break
            key = _key(name)
            if self.in_use(*key) or key in self._pulls:
                continue
            await self.provider.delete_version(*key)
            del self._index[name]
            total -= int(entry["bytes"])
            log.info("evicted a pulled start state", start_state_id=key[0], version=key[1],
                     bytes=int(entry["bytes"]))
        if total + need > self.cache_bytes:
            log.warning("registry cache over its size: every cached version is in use",
                        cache_mib=self.cache_bytes // MIB, held_mib=total // MIB, need_mib=need // MIB)
        await asyncio.to_thread(self._save_index)

    def cached(self) -> dict[tuple[str, int], int]:
        return {_key(n): int(e["bytes"]) for n, e in self._index.items()}

    def _load_index(self) -> dict[str, dict[str, float]]:
        try:
            data: Any = json.loads(self._index_path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): {"bytes": float(v.get("bytes", 0)), "used": float(v.get("used", 0))}
                for k, v in data.items() if isinstance(v, dict)}

    def _save_index(self) -> None:
        tmp = self._index_path.with_name(INDEX + ".partial")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(self._index))
        os.replace(tmp, self._index_path)


def _key(name: str) -> tuple[str, int]:
    ssid, _, v = name.rpartition("/")
    return ssid, int(v)
