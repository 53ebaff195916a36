"""An OCI registry client: the distribution API (OCI distribution-spec v1.1) over httpx.

Why this and not the ORAS Python SDK (`oras` 0.2.x): the daemon is asyncio and httpx is already a
dependency with async streaming; ORAS's SDK is synchronous on `requests` (every pull would take a
worker thread, and a cancelled attempt could not stop it), it verifies a blob only after writing it
whole, and its chunked upload and timeouts are not ours to bound per call. What we need of the API is
small: blob HEAD/GET, the upload session (POST, PATCH chunks, PUT ?digest), and manifest GET/PUT.
ORAS's Python SDK (50 MB from Debian's registry in 0.24 s on loopback) is the bar
`bench/two_hosts.py` holds this client to.

Guarantees:
- every request is bounded: connect/read/write/pool timeouts per call (httpx), and each operation's
  whole duration by `gh_common.timeouts`;
- blobs are addressed by sha256; a pulled blob is hashed while it streams and written to
  `NAME.partial`, renamed into place only when its digest and size match (a half-written or
  mismatching file is removed: nothing unverified is ever at the final path);
- blobs over `chunk_bytes` are uploaded in chunks (PATCH with Content-Range), smaller ones in one PUT;
- errors are typed: `RegistryUnavailable` (cannot connect, timed out, 5xx), `RegistryAuthError`
  (401/403 with our credentials), `NotFound`, `DigestMismatch` (both digests), `RegistryError`;
- credentials never reach a log or an exception message.

Auth: HTTP basic (distribution's htpasswd) and the bearer-token flow (`WWW-Authenticate: Bearer
realm=...`, as GHCR, Harbor and distribution with a token server answer).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import re
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from gh_common.timeouts import timeout as bounded

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
EMPTY_JSON_DIGEST = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"  # b"{}"
READ_SIZE = 1024 * 1024
DEFAULT_CHUNK = 64 * 1024 * 1024
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


class RegistryError(Exception):
    """The registry answered something we cannot use (the message says what and where)."""


class RegistryUnavailable(RegistryError):
    """The registry cannot be reached, timed out, or answered 5xx: try later or elsewhere."""


class RegistryAuthError(RegistryError):
    """The registry refused our credentials (401/403)."""


class NotFound(RegistryError):
    """No such manifest or blob in the repository."""


class DigestMismatch(RegistryError):
    """A blob's bytes do not hash to the digest that names it."""

    def __init__(self, what: str, expected: str, actual: str) -> None:
        super().__init__(f"{what}: digest mismatch: expected {expected}, got {actual}")
        self.expected = expected
        self.actual = actual


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    annotations: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Descriptor:
        digest = str(d.get("digest", ""))
        if not _DIGEST.match(digest):
            raise RegistryError(f"descriptor digest {digest[:80]!r} is not sha256:<64 hex>")
        size = d.get("size")
        if not isinstance(size, int) or size < 0:
            raise RegistryError(f"descriptor {digest} has no valid size")
        ann = d.get("annotations") or {}
        return cls(str(d.get("mediaType", "")), digest, size, {str(k): str(v) for k, v in ann.items()})


@dataclass(frozen=True)
class Manifest:
    """An OCI image manifest: what we push and pull (an artifact: our artifactType, layers of files)."""

    artifact_type: str
    layers: tuple[Descriptor, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)
    config: Descriptor = Descriptor(OCI_EMPTY_CONFIG, EMPTY_JSON_DIGEST, 2)

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": self.artifact_type,
            "config": self.config.to_json(), "layers": [d.to_json() for d in self.layers],
        }
        if self.annotations:
            body["annotations"] = dict(self.annotations)
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Manifest:
        try:
            d = json.loads(raw)
        except ValueError:
            raise RegistryError("manifest is not JSON") from None
        if not isinstance(d, dict) or d.get("schemaVersion") != 2 or not isinstance(d.get("layers"), list):
            raise RegistryError("not an OCI image manifest (schemaVersion 2 with layers)")
        ann = d.get("annotations") or {}
        cfg = d.get("config") or {}
        return cls(artifact_type=str(d.get("artifactType") or cfg.get("mediaType") or ""),
                   layers=tuple(Descriptor.from_json(x) for x in d["layers"]),
                   annotations={str(k): str(v) for k, v in ann.items()},
                   config=Descriptor.from_json(cfg) if cfg else Descriptor(OCI_EMPTY_CONFIG, EMPTY_JSON_DIGEST, 2))


MIB = 1024 * 1024
DEFAULT_MIN_MIB_PER_S = 5.0  # the slowest link a transfer is waited for (config: registry.min_mib_per_s)


def transfer_bound(floor_s: float, size_bytes: int, min_mib_per_s: float) -> float:
    """Seconds a transfer of `size_bytes` is given: `floor_s` (a request's round trips, a slow start)
    plus its bytes at the slowest rate waited for. A fixed bound is too long for a small state whose
    registry trickles and too short for a Windows image on a slow link."""
    return floor_s + size_bytes / (min_mib_per_s * MIB)


@dataclass(frozen=True)
class RegistryTimeouts:
    connect: float = 5.0
    io: float = 30.0  # one read or write on the socket (a stalled transfer fails after this)
    call: float = 30.0  # a small request (ping, HEAD, manifest) from start to end
    blob: float = 60.0  # one blob's whole transfer: this floor plus its bytes at `min_mib_per_s`
    min_mib_per_s: float = DEFAULT_MIN_MIB_PER_S

    def blob_bound(self, size_bytes: int) -> float:
        return transfer_bound(self.blob, size_bytes, self.min_mib_per_s)


def sha256_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(READ_SIZE):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def load_credentials(path: Path, registry_url: str) -> tuple[str, str]:
    """`user:password` on one line, or a Docker `config.json` with an `auths` entry for the registry's
    host (`auth` base64 of user:password, or `username` and `password`).

    Raises:
        RegistryError: unreadable, empty, or no entry for this host (never echoes the secret).
    """
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise RegistryError(f"credentials file {path}: cannot read it: {e.strerror or e}") from None
    if not text:
        raise RegistryError(f"credentials file {path} is empty")
    if text.startswith("{"):
        try:
            auths = json.loads(text).get("auths") or {}
        except (ValueError, AttributeError):
            raise RegistryError(f"credentials file {path}: not a valid Docker config.json") from None
        host = urlsplit(registry_url).netloc
        for key, entry in auths.items():
            entry_host = key.removeprefix("https://").removeprefix("http://").split("/")[0]
            if not isinstance(entry, dict) or entry_host != host:
                continue
            if entry.get("auth"):
                try:
                    user, sep, pw = base64.b64decode(entry["auth"]).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    sep = ""
                if not sep:
                    raise RegistryError(f"credentials file {path}: auths[{key!r}].auth is not base64 of user:password")
                return user, pw
            if entry.get("username") is not None and entry.get("password") is not None:
                return str(entry["username"]), str(entry["password"])
        raise RegistryError(f"credentials file {path}: no auths entry for {host}")
    user, sep, pw = text.splitlines()[0].partition(":")
    if not sep or not user:
        raise RegistryError(f"credentials file {path}: expected one line `user:password` or a Docker config.json")
    return user, pw


def _raise_for(resp: httpx.Response, what: str) -> None:
    if resp.status_code < 400:
        return
    if resp.status_code >= 500:
        raise RegistryUnavailable(f"{what}: registry answered {resp.status_code}")
    if resp.status_code in (401, 403):
        raise RegistryAuthError(f"{what}: registry refused the credentials ({resp.status_code}); "
                                "check registry.credentials_file")
    if resp.status_code == 404:
        raise NotFound(f"{what}: not found")
    detail = ""
    try:
        errs = resp.json().get("errors") or []
        detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errs if isinstance(e, dict))[:300]
    except (ValueError, AttributeError):
        pass
    raise RegistryError(f"{what}: registry answered {resp.status_code} {detail}".rstrip())


class Registry:
    """One registry endpoint (`url`, e.g. https://registry.lab:5000), with our credentials and CA."""

    def __init__(self, url: str, *, credentials: tuple[str, str] | None = None, ca_file: Path | None = None,
                 timeouts: RegistryTimeouts | None = None, chunk_bytes: int = DEFAULT_CHUNK) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"registry url {url!r} must be http(s)://HOST[:PORT]")
        self.url = f"{parts.scheme}://{parts.netloc}"
        self.host = parts.netloc
        self._creds = credentials
        self.t = timeouts or RegistryTimeouts()
        self.chunk_bytes = chunk_bytes
        verify: ssl.SSLContext | bool = True
        if ca_file is not None:
            verify = ssl.create_default_context(cafile=str(ca_file))
        self._verify = verify
        self._blocking: httpx.Client | None = None  # blob pulls, in worker threads (see pull_blob)
        self._client = httpx.AsyncClient(
            base_url=self.url, verify=verify, follow_redirects=True,
            timeout=httpx.Timeout(self.t.io, connect=self.t.connect, pool=self.t.connect),
        )
        self._auth_header: str | None = None  # what the last challenge asked for (Basic or Bearer)
        self._tokens: dict[str, str] = {}  # bearer scope -> token

    async def close(self) -> None:
        await self._client.aclose()
        if self._blocking is not None:
            self._blocking.close()

    async def __aenter__(self) -> Registry:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- auth ----------------------------------------------------------------------------------

    def _basic(self) -> str | None:
        if self._creds is None:
            return None
        return "Basic " + base64.b64encode(f"{self._creds[0]}:{self._creds[1]}".encode()).decode()

    async def _answer_challenge(self, resp: httpx.Response, scope: str | None) -> str | None:
        """The Authorization header a 401's challenge asks for, or None when we cannot answer it."""
        challenge = resp.headers.get("www-authenticate", "")
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            return self._basic()
        if scheme.lower() != "bearer":
            return None
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        realm = fields.get("realm")
        if not realm:
            return None
        query = {"service": fields.get("service", "")}
        if scope or fields.get("scope"):
            query["scope"] = fields.get("scope") or scope or ""
        headers = {}
        if (basic := self._basic()) is not None:
            headers["Authorization"] = basic
        tok = await self._client.get(realm, params=query, headers=headers)
        _raise_for(tok, "registry token")
        body = tok.json()
        token = body.get("token") or body.get("access_token")
        if not token:
            raise RegistryAuthError("registry token endpoint gave no token")
        self._tokens[query.get("scope", "")] = token
        return f"Bearer {token}"

    async def _request(self, method: str, path: str, *, scope: str | None = None, stream: bool = False,
                       **kw: Any) -> httpx.Response:
        """One request, answering an auth challenge once. Connection faults become RegistryUnavailable."""
        headers = dict(kw.pop("headers", {}) or {})
        try:
            for attempt in range(2):
                if self._auth_header is not None:
                    headers["Authorization"] = self._auth_header
                req = self._client.build_request(method, path, headers=headers, **kw)
                resp = await self._client.send(req, stream=stream)
                if resp.status_code != 401 or attempt == 1:
                    return resp
                if stream:
                    await resp.aclose()
                answer = await self._answer_challenge(resp, scope)
                if answer is None or answer == self._auth_header:
                    return resp
                self._auth_header = answer
            raise AssertionError("unreachable")
        except httpx.TimeoutException as e:
            raise RegistryUnavailable(f"{method} {path}: registry timed out ({type(e).__name__})") from None
        except httpx.TransportError as e:
            raise RegistryUnavailable(f"{method} {path}: cannot reach the registry at {self.url}: "
                                      f"{type(e).__name__}: {e}") from None

    # -- API -----------------------------------------------------------------------------------

    async def ping(self) -> None:
        """Reach `/v2/` with our credentials.

        Raises:
            RegistryUnavailable, RegistryAuthError, RegistryError.
        """
        async with bounded(self.t.call):
            resp = await self._request("GET", "/v2/")
            if resp.status_code == 401 and self._auth_header is None and self._creds is None:
                raise RegistryAuthError("the registry asks for credentials and none are configured "
                                        "(registry.credentials_file)")
            _raise_for(resp, "GET /v2/")

    async def blob_exists(self, repo: str, digest: str) -> bool:
        async with bounded(self.t.call):
            resp = await self._request("HEAD", f"/v2/{repo}/blobs/{digest}", scope=f"repository:{repo}:pull")
        if resp.status_code == 404:
            return False
        _raise_for(resp, f"HEAD blob {digest[:19]}")
        return True

    async def push_blob(self, repo: str, path: Path, media_type: str,
                        annotations: Mapping[str, str] | None = None) -> Descriptor:
        """Upload a file as a blob (skipped when the registry has it already); returns its descriptor."""
        digest, size = await asyncio.to_thread(sha256_file, path)
        desc = Descriptor(media_type, digest, size, dict(annotations or {}))
        if await self.blob_exists(repo, digest):
            return desc
        scope = f"repository:{repo}:pull,push"
        async with bounded(self.t.blob_bound(size)):
            resp = await self._request("POST", f"/v2/{repo}/blobs/uploads/", scope=scope)
            _raise_for(resp, "start blob upload")
            location = resp.headers.get("location")
            if not location:
                raise RegistryError("start blob upload: no Location in the answer")
            if size <= self.chunk_bytes:
                data = await asyncio.to_thread(path.read_bytes)
                resp = await self._request("PUT", _with_digest(location, digest), content=data, scope=scope,
                                           headers={"Content-Type": "application/octet-stream"})
                _raise_for(resp, f"upload blob {digest[:19]}")
                return desc
            offset = 0
            with path.open("rb") as f:
                while True:
                    chunk = await asyncio.to_thread(f.read, self.chunk_bytes)
                    if not chunk:
                        break
                    end = offset + len(chunk) - 1
                    resp = await self._request(
                        "PATCH", location, content=chunk, scope=scope,
                        headers={"Content-Type": "application/octet-stream", "Content-Range": f"{offset}-{end}",
                                 "Content-Length": str(len(chunk))})
                    _raise_for(resp, f"upload chunk {offset}-{end} of {digest[:19]}")
                    location = resp.headers.get("location") or location
                    offset = end + 1
            resp = await self._request("PUT", _with_digest(location, digest), scope=scope,
                                       headers={"Content-Length": "0"})
            _raise_for(resp, f"finish upload of {digest[:19]}")
        return desc

    async def push_bytes(self, repo: str, data: bytes, media_type: str) -> Descriptor:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        desc = Descriptor(media_type, digest, len(data))
        if await self.blob_exists(repo, digest):
            return desc
        scope = f"repository:{repo}:pull,push"
        async with bounded(self.t.call):
            resp = await self._request("POST", f"/v2/{repo}/blobs/uploads/", scope=scope)
            _raise_for(resp, "start blob upload")
            location = resp.headers.get("location") or ""
            resp = await self._request("PUT", _with_digest(location, digest), content=data, scope=scope,
                                       headers={"Content-Type": "application/octet-stream"})
            _raise_for(resp, f"upload blob {digest[:19]}")
        return desc

    async def push_manifest(self, repo: str, tag: str, manifest: Manifest) -> str:
        """Upload the config blob (the empty `{}`) and the manifest under `tag`; returns its digest."""
        await self.push_bytes(repo, b"{}", OCI_EMPTY_CONFIG)
        body = manifest.encode()
        async with bounded(self.t.call):
            resp = await self._request("PUT", f"/v2/{repo}/manifests/{tag}", content=body,
                                       scope=f"repository:{repo}:pull,push", headers={"Content-Type": OCI_MANIFEST})
            _raise_for(resp, f"push manifest {repo}:{tag}")
        return "sha256:" + hashlib.sha256(body).hexdigest()

    async def get_manifest(self, repo: str, ref: str) -> tuple[str, Manifest]:
        """The manifest at a tag or digest, and its digest (checked when `ref` is a digest)."""
        async with bounded(self.t.call):
            resp = await self._request("GET", f"/v2/{repo}/manifests/{ref}", scope=f"repository:{repo}:pull",
                                       headers={"Accept": OCI_MANIFEST})
            _raise_for(resp, f"manifest {repo}:{ref}")
            raw = resp.content
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        if ref.startswith("sha256:") and ref != digest:
            raise DigestMismatch(f"manifest {repo}@{ref[:19]}", ref, digest)
        return digest, Manifest.decode(raw)

    async def pull_blob(self, repo: str, desc: Descriptor, dest: Path) -> None:
        """Stream a blob to `dest`, hashing as it comes; `dest` appears only when digest and size match.

        The transfer runs in a worker thread on a synchronous client: httpx's async stream costs
        about 3x a plain socket read here (bench/registry_pull.py), and the pull must be within 2x of
        a local copy. Cancelling (or the whole-blob bound) stops the thread at its next read (each
        read is bounded by `io`) and removes the partial file. The whole blob is bounded by
        `RegistryTimeouts.blob_bound` of its size.

        Raises:
            DigestMismatch: the bytes hash to another digest, or there are more or fewer of them than
                the descriptor says (nothing is left on disk).
            RegistryUnavailable, RegistryAuthError, NotFound, RegistryError, TimeoutError.
        """
        if not _DIGEST.match(desc.digest):
            raise RegistryError(f"blob digest {desc.digest[:80]!r} is not sha256:<64 hex>")
        tmp = dest.with_name(dest.name + ".partial")
        path = f"/v2/{repo}/blobs/{desc.digest}"
        stop = threading.Event()
        try:
            async with bounded(self.t.blob_bound(desc.size)):
                for attempt in range(2):
                    task = asyncio.ensure_future(asyncio.to_thread(self._fetch_to, path, desc, tmp, stop))
                    try:
                        status, challenge = await asyncio.shield(task)
                    except BaseException:
                        stop.set()  # the thread sees it at its next read, closes, and returns
                        await asyncio.shield(asyncio.wait([task]))
                        raise
                    if status != 401 or attempt == 1:
                        break
                    answer = await self._answer_challenge(challenge, f"repository:{repo}:pull")
                    if answer is None or answer == self._auth_header:
                        break
                    self._auth_header = answer
                _raise_for(httpx.Response(status), f"blob {desc.digest[:19]}")
            await asyncio.to_thread(tmp.rename, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _sync_client(self) -> httpx.Client:
        if self._blocking is None:
            self._blocking = httpx.Client(base_url=self.url, verify=self._verify, follow_redirects=True,
                                          timeout=httpx.Timeout(self.t.io, connect=self.t.connect,
                                                                pool=self.t.connect))
        return self._blocking

    def _fetch_to(self, path: str, desc: Descriptor, tmp: Path, stop: threading.Event) -> tuple[int, httpx.Response]:
        """In a worker thread: GET the blob into `tmp`, hashing it; (status, response) for a non-2xx
        answer, (200, response) when the bytes are whole and match.

        Raises:
            DigestMismatch, RegistryUnavailable, asyncio.CancelledError (stopped).
        """
        headers = {"Authorization": self._auth_header} if self._auth_header else {}
        h = hashlib.sha256()
        got = 0
        try:
            with self._sync_client().stream("GET", path, headers=headers) as resp:
                if resp.status_code >= 300:
                    resp.read()
                    return resp.status_code, resp
                with tmp.open("wb") as f:
                    for chunk in resp.iter_raw():  # as the socket gives them: re-chunking copies again
                        if stop.is_set():
                            raise asyncio.CancelledError()
                        got += len(chunk)
                        if got > desc.size:
                            break
                        h.update(chunk)
                        f.write(chunk)
                    f.flush()
                    os.fsync(f.fileno())
        except httpx.TimeoutException as e:
            raise RegistryUnavailable(f"blob transfer stalled ({type(e).__name__})") from None
        except httpx.TransportError as e:
            raise RegistryUnavailable(f"blob transfer from {self.url} broke off: {type(e).__name__}: {e}") from None
        if got != desc.size:
            shown = f"{got} bytes" if got < desc.size else f"more than {desc.size} bytes"
            raise DigestMismatch(f"blob {path}", f"{desc.digest} ({desc.size} bytes)", shown)
        actual = "sha256:" + h.hexdigest()
        if actual != desc.digest:
            raise DigestMismatch(f"blob {desc.digest}", desc.digest, actual)
        return 200, resp


def _with_digest(location: str, digest: str) -> str:
    """The upload URL with `digest=` added: the Location keeps the registry's own state in its query
    (distribution's `_state`), which httpx's `params=` would replace."""
    return str(httpx.URL(location).copy_merge_params({"digest": digest}))


def split_ref(ref: str) -> tuple[str, str, str]:
    """`host[:port]/repo/path:tag` or `...@sha256:...` -> (host, repo, tag-or-digest)."""
    host, sep, rest = ref.partition("/")
    if not sep or not rest or ("." not in host and ":" not in host and host != "localhost"):
        raise ValueError(f"{ref!r} must be HOST[:PORT]/REPOSITORY:TAG (or @sha256:DIGEST)")
    if "@" in rest:
        repo, _, tag = rest.partition("@")
    else:
        repo, _, tag = rest.rpartition(":") if ":" in rest else (rest, "", "latest")
    if not repo or not tag:
        raise ValueError(f"{ref!r} must be HOST[:PORT]/REPOSITORY:TAG (or @sha256:DIGEST)")
    return host, repo, tag
