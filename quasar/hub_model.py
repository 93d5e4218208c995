"""A reference model named by a Hugging Face id: found whole in the local cache, else downloaded into
it through huggingface_hub's ``snapshot_download``, and every way that fails said in one sentence
naming the model, the folder or the hub, and the cure (docs/validator.md, "The reference model").

A download cut off (a broken connection, a full disk) leaves the files it finished in the cache and
none half-written (huggingface_hub writes each to a temporary file and renames it when complete);
a snapshot missing a file counts as not cached, so the next start downloads what is missing
instead of failing on the folder for good. Before a download, a TCP connection to the hub, or to
the proxy the download goes through, tells a closed network at once (:func:`hub_reachable`).
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from quasar.config import REFERENCE_MODEL_ID
from quasar.errors import QuasarError
from quasar.log import library_progress_bars

# What loading a model needs from its repo: the configs and the safetensors weights (one file or
# shards with their index), not its tokenizer, README or other formats' copies of the weights.
MODEL_FILES = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json"]

# A start after a failed download keeps the files it finished (huggingface_hub renames each when whole).
_KEPT = "the files already downloaded are kept and the rest are fetched"


class ModelLoadError(QuasarError, RuntimeError):
    """The reference model could not be loaded; the message names the model and the fix."""


def missing_files(folder: Path) -> list[str]:
    """The files ``folder`` lacks to load a model: config.json, and model.safetensors or the
    shards its index names (a folder a cut-off download left)."""
    missing = [] if (folder / "config.json").is_file() else ["config.json"]
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return missing + ([] if (folder / "model.safetensors").is_file() else ["model.safetensors"])
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [*missing, index.name]
    return missing + [shard for shard in shards if not (folder / shard).is_file()]


def hub_cache() -> str:
    """The folder huggingface_hub keeps downloads in (``HF_HUB_CACHE``, by default ``$HF_HOME/hub``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def find_cached(name: str) -> tuple[Path, list[str]] | None:
    """The cached snapshot of hub model ``name`` and the files it lacks to load (none: complete),
    or None when nothing of it is cached. Uses no network."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(name, local_files_only=True, allow_patterns=MODEL_FILES))
    except (OSError, ValueError) as error:
        # huggingface_hub refuses a snapshot its own listing shows incomplete, and says where it is.
        path = getattr(error, "snapshot_path", None)
        return None if path is None else (Path(path), missing_files(Path(path)))
    return folder, missing_files(folder)


# How long a miner or validator waits to learn whether the Hugging Face hub can be reached at all.
HUB_PROBE_SECONDS = 3.0

# The port of a hub or proxy URL that names none, by its scheme, as huggingface_hub's HTTP client
# (httpx2) connects to it; any other scheme's is 80.
_DEFAULT_PORTS = {"https": 443, "socks5": 1080, "socks5h": 1080}


def hub_proxy(endpoint: str) -> str | None:
    """The proxy a download from ``endpoint`` goes through, None where it connects directly.

    As huggingface_hub's HTTP client (httpx2) reads the environment through urllib's ``getproxies``:
    ``https_proxy`` or ``http_proxy`` by the endpoint's scheme, else ``all_proxy``, each lower case
    before upper; none where ``no_proxy`` lists the endpoint's host (urllib's ``proxy_bypass``, on
    Linux ``proxy_bypass_environment``).
    """
    from urllib.request import getproxies, proxy_bypass

    proxies = getproxies()
    parts = urlsplit(endpoint)
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or proxy_bypass(parts.netloc.rpartition("@")[2]):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def shown_url(url: str) -> str:
    """``url`` as a message names it: its scheme, host and port only. A proxy's or a mirror's URL
    may carry a user and password; everything before the last '@' goes, so that one whose '/' or
    '#' was left unescaped (which ends the URL's host part early) is not shown either."""
    scheme, separator, rest = url.partition("://")
    host = re.split("[/?#]", (rest if separator else url).rpartition("@")[2], maxsplit=1)[0]
    return f"{scheme}://{host}" if separator else host


def hub_reachable(timeout: float = HUB_PROBE_SECONDS) -> tuple[bool, str]:
    """Whether a TCP connection to what a download connects to opens within ``timeout`` seconds: the
    proxy of :func:`hub_proxy`, else the hub (``HF_ENDPOINT``, default huggingface.co); and that,
    said for a message (:func:`shown_url`). Without one, a download would retry for half a minute."""
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    proxy = hub_proxy(endpoint)
    parts = urlsplit(proxy or endpoint)
    hub = shown_url(endpoint)
    target = hub if proxy is None else f"the proxy {shown_url(proxy)} for {hub}"
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)
        socket.create_connection((parts.hostname or "", port), timeout=timeout).close()
    except (OSError, ValueError):  # ValueError: a port that is not a number
        return False, target
    return True, target


# hf_xet's bounds on a download from Xet's storage, where the process's environment sets none
# (docs/validator.md, "The reference model"). Its own (a read waits up to 300 s, a connection 60 s,
# each request tried 6 times) held a start more than half an hour on a server that accepts the
# connection and never answers; these end it within 2 minutes: 4 tries of 20 s, 3 pauses of up to
# 3, 9 and 27 s. A read's timeout restarts at each packet, so a slow link that delivers is not cut
# (huggingface_hub's own HTTP download waits 10 s). hf_xet reads them when its first download starts.
XET_BOUNDS = {
    "HF_XET_CLIENT_READ_TIMEOUT": "20s",
    "HF_XET_CLIENT_CONNECT_TIMEOUT": "10s",
    "HF_XET_CLIENT_RETRY_MAX_ATTEMPTS": "3",  # retries after the first try
}
_XET_RETRIES = "HF_XET_CLIENT_RETRY_MAX_ATTEMPTS"
# What hf_xet takes instead of a value it cannot read, which it says only in its own log file.
_XET_DEFAULTS = {"HF_XET_CLIENT_READ_TIMEOUT": "300s", "HF_XET_CLIENT_CONNECT_TIMEOUT": "60s", _XET_RETRIES: "5"}


def bound_xet() -> None:
    """Put :data:`XET_BOUNDS` into this process's environment (its children inherit them), each
    where the environment does not set it already: a value the user set is kept.

    Raises :class:`ModelLoadError` for a value set that hf_xet cannot read: a duration without its
    unit (hf_xet's parser, humantime, needs one) or empty, a number of retries that is no whole number.
    """
    for variable, value in XET_BOUNDS.items():
        given = os.environ.setdefault(variable, value)
        if variable == _XET_RETRIES:
            readable, form = re.fullmatch(r"\+?\d+", given) is not None, "a whole number of retries, as 3"
        else:
            readable, form = re.fullmatch(r"[\d.\s]*", given) is None, "a duration with its unit, as 60s or 2m"
        if not readable:
            raise ModelLoadError(
                f"{variable} is {given!r}, which hf_xet (the reference model's download from Xet's storage) "
                f"cannot read and replaces with its own {_XET_DEFAULTS[variable]}. Write it as {form}, or unset "
                f"it for {value} "
                '(docs/validator.md, "The reference model").'
            )


def download(name: str) -> Path:
    """Download hub model ``name``'s :data:`MODEL_FILES` into the cache; the snapshot's folder.

    Raises :class:`ModelLoadError` naming the model and the cure: the hub's refusal (gated, no such
    model, a bad token), its limit or fault (429, 5xx), a cut-off download, Xet's storage failing or
    silent (:func:`bound_xet`), a full or unwritable cache.
    """
    from huggingface_hub import snapshot_download

    bound_xet()
    try:
        with library_progress_bars(shown=sys.stderr.isatty()):
            folder = Path(snapshot_download(name, allow_patterns=MODEL_FILES))
    except Exception as error:  # classified by _why; an unforeseen one is named by its type and first line
        raise ModelLoadError(f"cannot download reference model {name!r}: {_why(error)}") from None
    missing = missing_files(folder)
    if missing:
        raise ModelLoadError(
            f"reference model {name!r} on the Hub has no {missing[0]}: it is not a model saved with "
            f"safetensors weights. Point REFERENCE_MODEL at one (the reference is {REFERENCE_MODEL_ID})."
        )
    return folder


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


# A user and password in a URL an error's text quotes (huggingface_hub's errors name the request's URL,
# HF_ENDPOINT's credentials included).
_URL_CREDENTIALS = re.compile(r"(?<=://)[^\s/'\"@]+@")


def first_line(error: BaseException) -> str:
    """``error`` in one line for a message: its type and first non-empty line, without the user and
    password of any URL it quotes."""
    lines = [line for line in _URL_CREDENTIALS.sub("", str(error)).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


# How hf_xet's error (a RuntimeError, which carries no errno) ends when a write of the file it
# downloads, which it writes itself, finds the disk full: Rust's text of the I/O error.
_XET_DISK_FULL = f"(os error {errno.ENOSPC})"


def _xet_storage(error: BaseException) -> str | None:
    """``Xet's storage`` and the URL of its CAS server (:func:`shown_url`) that hf_xet was downloading
    from when it raised ``error``, else None. hf_xet's errors have no class of their own (a
    RuntimeError), but hf_xet raises them straight into huggingface_hub's ``xet_get``, which holds
    the server the hub's token route named (its ``connection_info``)."""
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    if frame is None or frame.tb_frame.f_code.co_name != "xet_get":
        return None
    endpoint = getattr(frame.tb_frame.f_locals.get("connection_info"), "endpoint", None)
    return f"Xet's storage {shown_url(endpoint)}" if isinstance(endpoint, str) else "Xet's storage"


def _request_origin(error: BaseException) -> str | None:
    """The scheme, host and port of the request an httpx2 error failed (:func:`shown_url`): the
    hub's, or the host it redirected the download to; None for an error of no request."""
    import httpx2

    try:
        return shown_url(str(error.request.url)) if isinstance(error, httpx2.RequestError) else None
    except RuntimeError:  # httpx2 raises it for an error its client did not give the request to
        return None


def _why(error: BaseException) -> str:
    """What went wrong, in one sentence with its cure."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    chain = _chain(error)
    hub = shown_url(constants.ENDPOINT)
    for cause in chain:
        if isinstance(cause, GatedRepoError):
            return (
                f"{hub} refuses it, a gated model (HTTP {cause.response.status_code}). Accept its terms on its "
                "page with your account and give this process that account's token (HF_TOKEN, or `hf auth login`)."
            )
        if isinstance(cause, RepositoryNotFoundError):
            return (
                f"{hub} has no model of that name, or not for this token (HTTP {cause.response.status_code}). "
                f"Check REFERENCE_MODEL for a typo (the reference is {REFERENCE_MODEL_ID}); a private "
                "model needs HF_TOKEN."
            )
        if isinstance(cause, HfHubHTTPError) and cause.response is not None:
            status = cause.response.status_code
            if status in (401, 403):
                return (
                    f"{hub} refused the request (HTTP {status}): check the token this process sends "
                    "(HF_TOKEN, or `hf auth login`), or unset it for a public model."
                )
            if status == 429:
                return (
                    f"{hub} is limiting this machine's requests (HTTP 429). Wait a few minutes and start again "
                    f"({_KEPT}); a token (HF_TOKEN) gets a higher limit."
                )
            if status >= 500:
                return f"{hub} answered HTTP {status}, a fault on its side. Start again later ({_KEPT})."
    for cause in chain:
        if (isinstance(cause, OSError) and cause.errno == errno.ENOSPC) or str(cause).endswith(_XET_DISK_FULL):
            return (
                f"the disk of the Hugging Face cache {hub_cache()} is full ({first_line(cause)}). Free space "
                f"there, or set HF_HOME to a folder on a larger disk, and start again ({_KEPT})."
            )
        if isinstance(cause, OSError) and cause.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return (
                f"user {os.getuid()} cannot write the Hugging Face cache {hub_cache()} ({first_line(cause)}). "
                "Make that folder writable by this user, or set HF_HOME to a folder it owns."
            )
    for cause in chain:
        storage = _xet_storage(cause)
        if storage is not None:
            return (
                f"{hub} answers, but the download from {storage} failed ({first_line(cause)}). "
                "The hub keeps the weights on Xet, which huggingface_hub downloads from through hf_xet: open this "
                f"host's way out to {storage}, or set HF_HUB_DISABLE_XET=1 to download them through the hub's "
                f"HTTP redirect instead, and start again ({_KEPT})."
            )
    for cause in chain:
        if isinstance(cause, httpx2.TransportError) or "Consistency check failed" in str(cause):
            source = _request_origin(cause) or hub
            if isinstance(cause, (httpx2.ConnectError, httpx2.ConnectTimeout)) and source != hub:
                return (
                    f"{hub} answers, but {source}, where it redirects the download, cannot be reached "
                    f"({first_line(cause)}). Open this host's way out to {source} and start again ({_KEPT})."
                )
            return (
                f"the download from {source} broke off ({first_line(cause)}); nothing half-written is kept. "
                f"Start again: {_KEPT}."
            )
    return f"{first_line(error)}. Check the network to {hub} and start again ({_KEPT})."
