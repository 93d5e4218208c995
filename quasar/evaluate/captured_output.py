"""What a sandboxed child wrote to stdout and stderr, as the parent keeps it: its head and its tail."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

KEPT_OUTPUT_BYTES = 32 * 1024


@dataclass
class CapturedOutput:
    """What the child wrote to stdout and stderr: its head and tail, and how much in all."""

    total_bytes: int = 0
    head: bytearray = field(default_factory=bytearray)
    tail: collections.deque = field(default_factory=collections.deque)
    tail_bytes: int = 0
    flooded: bool = False

    def add(self, chunk: bytes) -> None:
        self.total_bytes += len(chunk)
        room = KEPT_OUTPUT_BYTES - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail.append(chunk)
            self.tail_bytes += len(chunk)
            while self.tail_bytes - len(self.tail[0]) >= KEPT_OUTPUT_BYTES:
                self.tail_bytes -= len(self.tail.popleft())

    def text(self) -> str:
        """Head and tail as text, with a note of what was left out between them."""
        tail = b"".join(self.tail)[-KEPT_OUTPUT_BYTES:]
        skipped = self.total_bytes - len(self.head) - len(tail)
        middle = f"\n[... {skipped} bytes left out ...]\n".encode() if skipped > 0 else b""
        return (bytes(self.head) + middle + tail).decode("utf-8", errors="replace")
