"""How each setting's raw text (from a flag, the environment or .env) becomes its typed value.

Every parser takes the raw string and returns the value or raises ``ValueError`` saying what was
expected; :func:`quasar.config.resolve` adds which setting it was and where the value came from.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlparse

# Bittensor's own network names, plus our embedded one-machine chain ("devchain", so it never
# collides with Bittensor's "local", which means a subtensor node on this machine).
BITTENSOR_NETWORKS = ("finney", "test", "local", "archive")
DEV_NETWORK = "devchain"
# Where anyone may mine or validate: endpoints there must be public addresses (docs/rules.md section 4).
PUBLIC_NETWORKS = ("finney", "test", "archive")
NETWORKS = BITTENSOR_NETWORKS + (DEV_NETWORK,)
# The sequence lengths an evaluation runs, a miner's target among them (docs/rules.md section 3):
# the API refuses a target outside them, which no validator could evaluate. The largest keeps the
# evaluation's output area (2 KiB a token of each length, docs/evaluation.md Limits) within the
# default SANDBOX_MEMORY_MB beside the default EVAL_SEQ_LENS (tests/test_evaluate_head_start.py).
MIN_SEQ_LEN = 64
MAX_SEQ_LEN = 8_000_000


def parse_int(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip().replace("_", ""))
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ValueError(f"must be {bound}, got {value}")
        return value

    return parse


def parse_optional_int(low: int, high: int | None = None) -> Callable[[str], int | None]:
    parse_bounded = parse_int(low, high)

    def parse(raw: str) -> int | None:
        return None if raw.strip() == "" else parse_bounded(raw)

    return parse


def parse_float(low: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"expected a number, got {raw!r}") from None
        if not value >= low:
            raise ValueError(f"must be at least {low}, got {raw}")
        return value

    return parse


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_share(raw: str) -> float:
    """A share in (0, 1]."""
    value = parse_float(0.0)(raw)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"must be above 0 and at most 1, got {raw}")
    return value


def parse_majority_share(raw: str) -> float:
    """A share in [0.5, 1]: more than the stake that could agree on anything else."""
    value = parse_float(0.0)(raw)
    if not 0.5 <= value <= 1.0:
        raise ValueError(f"must be at least 0.5 and at most 1, got {raw}")
    return value


def parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected true or false, got {raw!r}")


def parse_str(raw: str) -> str:
    return raw.strip()


# Logs mask every occurrence of a secret's value: a shorter one would mask ordinary text in them.
MIN_SECRET_LENGTH = 8


def parse_secret(raw: str) -> str:
    """A secret (a token, a key): empty where not set, else at least MIN_SECRET_LENGTH characters.
    Its value is never in the refusal."""
    value = raw.strip()
    if 0 < len(value) < MIN_SECRET_LENGTH:
        raise ValueError(
            f"{len(value)} character{'s' if len(value) > 1 else ''}, too short to keep out of the logs: masking it "
            f"would mask that text wherever it stands in them; give the whole token or key ({MIN_SECRET_LENGTH} "
            "characters or more), or leave it empty"
        )
    return value


def parse_network(raw: str) -> str:
    value = raw.strip()
    if value in NETWORKS:
        return value
    raise ValueError(f"unknown network {value!r}; expected one of {', '.join(NETWORKS)}")


def parse_chain_endpoint(raw: str) -> str:
    value = raw.strip()
    if value and urlparse(value).scheme not in ("ws", "wss"):
        raise ValueError(f"expected a ws:// or wss:// URL, got {value!r}")
    return value


def parse_http_url(raw: str) -> str:
    value = raw.strip().rstrip("/")
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"expected an http:// or https:// URL, got {raw!r}")
    return value


_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def parse_device(raw: str) -> str:
    value = raw.strip()
    if not _DEVICE.match(value):
        raise ValueError(f"expected cpu, cuda or cuda:N, got {raw!r}")
    return value


_DTYPES = ("float32", "bfloat16", "float16")


def parse_dtype(raw: str) -> str:
    value = raw.strip()
    if value not in _DTYPES:
        raise ValueError(f"expected one of {', '.join(_DTYPES)}, got {raw!r}")
    return value


def parse_name(raw: str) -> str:
    """Wallet and user names: no path separators, so a name never escapes the wallet folder."""
    value = raw.strip()
    if not value or "/" in value or "\\" in value or value in (".", ".."):
        raise ValueError(f"expected a plain name, got {raw!r}")
    return value


def parse_optional_name(raw: str) -> str:
    return "" if raw.strip() == "" else parse_name(raw)


_REPO_SLUG = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")


def parse_repo_slug(raw: str) -> str:
    """A GitHub repository as ``OWNER/REPO``."""
    value = raw.strip()
    if not _REPO_SLUG.match(value) or value.split("/")[1] in (".", ".."):
        raise ValueError(f"expected OWNER/REPO, got {raw!r}")
    return value


def parse_git_remote_base(raw: str) -> str:
    """Where git remotes live: an http(s) URL without credentials, or ``file:///DIR`` (local bare
    repositories)."""
    value = raw.strip().rstrip("/")
    if value.startswith("file:///"):
        return value
    value = parse_http_url(value)
    # The fork's URL is built on it: a token here would be in every claim the API is sent, in the
    # clone's .git/config and in logs. Git gets GITHUB_TOKEN for each command instead.
    if "@" in urlparse(value).netloc:
        raise ValueError("must not contain a user name or token: git is given GITHUB_TOKEN for each command")
    return value


def parse_optional_http_url(raw: str) -> str:
    return "" if raw.strip() == "" else parse_http_url(raw)


def parse_optional_ip(raw: str) -> str:
    """An IPv4 or IPv6 address (the chain stores addresses, not names); empty means none."""
    value = raw.strip()
    if not value:
        return ""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"expected an IPv4 or IPv6 address (the chain stores no host names), got {raw!r}") from None


def parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {raw!r}")
        return value

    return parse


def parse_database_url(raw: str) -> str:
    value = raw.strip()
    if not value.startswith(("sqlite:///", "postgresql://", "postgresql+psycopg2://")):
        raise ValueError("expected sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE")
    # A password here would end up in process listings and logs: it belongs in PGPASSWORD or ~/.pgpass.
    if urlparse(value).password is not None:
        raise ValueError("must not contain a password; put it in PGPASSWORD or ~/.pgpass")
    return value


def parse_ip_networks(raw: str) -> tuple[str, ...]:
    """Comma-separated IP addresses or CIDR networks (e.g. ``127.0.0.1,10.0.0.0/8``)."""
    networks = []
    for part in filter(None, (item.strip() for item in raw.split(","))):
        try:
            networks.append(str(ipaddress.ip_network(part, strict=False)))
        except ValueError:
            raise ValueError(f"expected IP addresses or CIDR networks, got {part!r}") from None
    return tuple(networks)


# A length may be written with a suffix: 100k is 100,000 tokens, 1M is 1,000,000.
_LENGTH_SUFFIXES = {"k": 1000, "m": 1_000_000}


def parse_seq_lens(raw: str, minimum: int = 1) -> tuple[int, ...]:
    """Comma-separated sequence lengths, each at least ``minimum``: whole numbers, ``_`` between
    digits allowed, with an optional ``k`` (thousand) or ``M`` (million): ``512,1024,100k,1M``.
    Empty means none. The one reading of a list of lengths, for settings and flags alike."""
    lengths = []
    for part in filter(None, (item.strip() for item in raw.split(","))):
        text = part.lower().replace("_", "")
        scale = _LENGTH_SUFFIXES.get(text[-1:], 1)
        digits = text[:-1] if scale != 1 else text
        if not (digits.isascii() and digits.isdigit()) or int(digits) * scale < minimum:
            raise ValueError(f"expected comma-separated lengths of at least {minimum} (512,1024,100k,1M), got {part!r}")
        lengths.append(int(digits) * scale)
    return tuple(lengths)


def format_seq_lens(lengths: Iterable[int]) -> str:
    """``lengths`` as :func:`parse_seq_lens` reads them, whole millions and thousands with their
    suffix: ``(65536, 100000, 1000000)`` is ``65536,100k,1M``."""
    return ",".join(_length_text(length) for length in lengths)


def _length_text(length: int) -> str:
    for suffix, scale in (("M", 1_000_000), ("k", 1000)):
        if length and length % scale == 0:
            return f"{length // scale}{suffix}"
    return str(length)


# Parsers by the ``kind`` a settings entry names (settings/*.toml); the factories take the entry's low, high or choices.
PARSERS: dict[str, Callable[[str], Any]] = {
    "bool": parse_bool,
    "chain_endpoint": parse_chain_endpoint,
    "database_url": parse_database_url,
    "device": parse_device,
    "dtype": parse_dtype,
    "git_remote_base": parse_git_remote_base,
    "http_url": parse_http_url,
    "ip_networks": parse_ip_networks,
    "name": parse_name,
    "network": parse_network,
    "majority_share": parse_majority_share,
    "optional_http_url": parse_optional_http_url,
    "optional_ip": parse_optional_ip,
    "optional_name": parse_optional_name,
    "repo_slug": parse_repo_slug,
    "secret": parse_secret,
    "seq_lens": parse_seq_lens,
    "share": parse_share,
    "str": parse_str,
}
BOUNDED_PARSERS: dict[str, Callable[..., Callable[[str], Any]]] = {
    "int": parse_int,
    "optional_int": parse_optional_int,
    "float": parse_float,
}


def parser_for(
    kind: str, low: float | None = None, high: float | None = None, choices: Sequence[str] = ()
) -> Callable[[str], Any]:
    """The parser of ``kind``: a plain one, a bounded one (``int``, ``optional_int``, ``float``
    from ``low``, to ``high`` for ``int``) or ``choice`` among ``choices``."""
    if kind == "choice":
        if not choices:
            raise ValueError("kind choice needs choices")
        return parse_choice(*choices)
    if kind in BOUNDED_PARSERS:
        if low is None:
            raise ValueError(f"kind {kind} needs low")
        return BOUNDED_PARSERS[kind](low, high) if high is not None else BOUNDED_PARSERS[kind](low)
    if kind not in PARSERS:
        raise ValueError(
            f"unknown kind {kind!r}; expected one of {', '.join(sorted([*PARSERS, *BOUNDED_PARSERS, 'choice']))}"
        )
    return PARSERS[kind]
