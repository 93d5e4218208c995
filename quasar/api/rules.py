"""The submission API's rules as pure functions: commitments, reveal windows, rounds, client addresses.

Nothing here touches the database, the chain or the clock; the service passes the current block and
time in, so every rule is tested on its own.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

SALT_MIN_HEX = 32  # 16 bytes, docs/rules.md section 3
SALT_MAX_HEX = 128

# IP bans (docs/rules.md section 3): this many failed validations from one IP inside the window ban it.
BAN_FAILURES = 5
BAN_WINDOW_S = 24 * 3600.0
BAN_DURATION_S = 24 * 3600.0

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# An IPv6 client is counted by its /64: one subscriber's network, which it can walk at will.
IPV6_CLIENT_PREFIX = 64


def new_salt() -> str:
    """A fresh random salt for a commitment: 32 bytes as 64 hex characters."""
    return secrets.token_hex(32)


def commitment_hash(salt: str, fork_url: str, commit_hash: str) -> str:
    """``sha256(salt + fork_url + commit_hash)`` as lowercase hex, over the exact strings revealed."""
    return hashlib.sha256((salt + fork_url + commit_hash).encode("utf-8")).hexdigest()


RevealState = Literal["waiting", "open", "expired"]


@dataclass(frozen=True)
class RevealWindow:
    """Blocks in which a commitment may be revealed: ``opens``..``closes``."""

    opens: int
    closes: int

    def state(self, block: int) -> RevealState:
        """``waiting`` before the window, ``open`` inside it, ``expired`` after it."""
        if block < self.opens:
            return "waiting"
        return "open" if block <= self.closes else "expired"


def reveal_window(commit_block: int, blocks_until_reveal: int, window_blocks: int) -> RevealWindow:
    """A reveal opens ``blocks_until_reveal`` blocks after the commit and stays open ``window_blocks``."""
    opens = commit_block + blocks_until_reveal
    return RevealWindow(opens, opens + window_blocks - 1)


def counts_from_block(method: str, submitted_block: int, blocks_until_reveal: int) -> int:
    """The block from which a submission counts for originality (docs/rules.md section 5): a direct
    submission's own (it is made ready then), a commitment's the opening of its reveal window (the
    commit block plus ``blocks_until_reveal``). So committing to a commit that is already public
    never makes it one's own, while a miner that publishes its commit when its window opens still
    comes before anyone submitting it after seeing it."""
    return submitted_block + blocks_until_reveal if method == "commit_reveal" else submitted_block


@dataclass(frozen=True)
class Round:
    """Competition round ``round_id``: chain blocks ``start_block``..``end_block``."""

    round_id: int
    start_block: int
    end_block: int

    def blocks_left(self, block: int) -> int:
        return max(0, self.end_block + 1 - block)


def round_of_block(block: int, round_blocks: int) -> Round:
    """The round holding ``block``: round N covers blocks N*round_blocks .. (N+1)*round_blocks - 1."""
    if block < 0 or round_blocks < 1:
        raise ValueError(f"need block >= 0 and round_blocks >= 1, got {block}, {round_blocks}")
    return round_by_id(block // round_blocks, round_blocks)


def round_by_id(round_id: int, round_blocks: int) -> Round:
    """Round ``round_id``: blocks ``round_id * round_blocks`` .. ``(round_id + 1) * round_blocks - 1``."""
    return Round(round_id, round_id * round_blocks, (round_id + 1) * round_blocks - 1)


def parse_networks(networks: Iterable[str]) -> tuple[IpNetwork, ...]:
    return tuple(ipaddress.ip_network(network, strict=False) for network in networks)


def _is_trusted(address: str, trusted: Sequence[IpNetwork]) -> bool:
    if not trusted:  # no proxies configured (the common case): nothing to parse
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in trusted)


def client_ip(peer: str | None, forwarded_for: Sequence[str], trusted: Sequence[IpNetwork]) -> str:
    """The address a request came from, believing ``X-Forwarded-For`` only as far as trusted proxies.

    ``peer`` is the TCP peer. While the current hop is a trusted proxy, step to the hop it reports
    (the rightmost remaining X-Forwarded-For entry); the first untrusted hop is the client. A client
    can prepend anything to the header, but it can never get past an untrusted hop, so its own
    entries are never believed. ``forwarded_for`` holds the header values in the order received.
    """
    current = peer or "unknown"
    hops = [hop.strip() for value in forwarded_for for hop in value.split(",")]
    while _is_trusted(current, trusted) and hops:
        reported = hops.pop()
        try:
            current = str(ipaddress.ip_address(reported))
        except ValueError:
            return reported[:64] or current  # a trusted proxy passed on something that is not an IP
    return current


def address_key(address: str) -> str:
    """The client ``address`` as failures, bans and logs count it: an IPv4 address as it is (also
    when it arrives IPv4-mapped, ``::ffff:a.b.c.d``); an IPv6 address as its /64 network (``2001:db8:1:2::/64``),
    since one subscriber holds a whole /64 and could otherwise walk it; anything else unchanged."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip), IPV6_CLIENT_PREFIX), strict=False))
    return str(ip)
