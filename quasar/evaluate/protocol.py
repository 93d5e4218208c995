"""The message channel between the evaluation parent and its sandboxed child: a pipe pair it owns.

A frame is a 4-byte big-endian header length, a JSON header, then ``header["nbytes"]`` raw bytes
(zero for most messages; a layer output for the correctness check). The reader bounds both parts,
so a hostile child cannot make the parent allocate or wait without limit; every parent-side read
has a deadline. Standard library only: the child imports this file from the harness's own copy.

Large payloads (a layer output: 1 GiB at a million tokens in bfloat16) can go through a
:class:`SharedArea` instead, a memory file the parent creates and the child inherits: the child
copies the bytes into its mapping where the parent said and names how many in the reply's
header. The child can write to the area at any time, so the parent either copies a payload out
into memory of its own at once, or reads it in place only after every process of the sandbox
is gone.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import select
import struct
import time
from typing import TypeGuard

_LENGTH = struct.Struct(">I")
MAX_HEADER_BYTES = 1 << 20


def is_count(value: object) -> TypeGuard[int]:
    """Whether ``value``, read from the other side's JSON, is a whole number from 0 up (not a bool,
    a float or a string): what every count and size it sends must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class ChannelError(Exception):
    """The other side broke the protocol, went away, or missed a deadline."""


class ChannelTimeout(ChannelError):
    """No complete message arrived before the deadline."""


class ChannelClosed(ChannelError):
    """The other side closed its end (it exited or crashed)."""


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


class Channel:
    """One end of the harness's pipe pair: ``send`` frames to ``write_fd``, ``recv`` from ``read_fd``.

    ``spin_seconds``: a ``recv`` first busy-polls the pipe for up to this long before sleeping in
    ``poll``. A process blocked on a pipe is woken by the scheduler, which costs tens to hundreds
    of microseconds and varies (most on virtual machines); spinning keeps that out of timings.
    """

    def __init__(self, read_fd: int, write_fd: int, spin_seconds: float = 0.0):
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.spin_seconds = spin_seconds
        self._poller = select.poll()
        self._poller.register(read_fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def send(self, header: dict, payload: bytes | memoryview | None = None) -> None:
        """Send one frame; ``payload`` (raw bytes) follows the JSON header when given."""
        body = dict(header)
        body["nbytes"] = 0 if payload is None else memoryview(payload).nbytes
        encoded = json.dumps(body, separators=(",", ":")).encode()
        _write_all(self.write_fd, _LENGTH.pack(len(encoded)) + encoded)
        if payload is not None:
            _write_all(self.write_fd, payload)

    def _wait_readable(self, deadline: float | None, spin_until: float) -> None:
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise ChannelTimeout("no reply before the deadline")
            if now < spin_until:
                if self._poller.poll(0):
                    return
                continue
            timeout_ms = -1 if deadline is None else max(1, int((deadline - now) * 1000))
            if self._poller.poll(timeout_ms):
                return

    def _read_exact(self, size: int, deadline: float | None) -> bytearray:
        buffer = bytearray(size)
        view = memoryview(buffer)
        filled = 0
        spin_until = time.monotonic() + self.spin_seconds
        while filled < size:
            self._wait_readable(deadline, spin_until)
            count = os.readv(self.read_fd, [view[filled:]])
            if count == 0:
                raise ChannelClosed("the other side closed the channel")
            filled += count
        return buffer

    def recv(self, deadline: float | None = None, max_payload: int = 0) -> tuple[dict, bytearray | None]:
        """Read one frame: ``(header, payload or None)``.

        ``deadline`` is a ``time.monotonic()`` value (None waits forever); a payload larger than
        ``max_payload`` bytes, an oversized header or one that does not decode (whatever the
        decoder raised) raise :class:`ChannelError`. The header's values are not checked here:
        each reader checks the fields it takes.
        """
        (length,) = _LENGTH.unpack(self._read_exact(_LENGTH.size, deadline))
        if length > MAX_HEADER_BYTES:
            raise ChannelError(f"message header of {length} bytes exceeds the {MAX_HEADER_BYTES}-byte limit")
        raw = self._read_exact(length, deadline)
        try:
            header = json.loads(raw)
        except Exception as error:
            # Not only bad JSON: an integer of more digits than Python converts (ValueError) or
            # arrays nested past the recursion limit (RecursionError) are the other side's error too.
            raise ChannelError(f"malformed message header: {type(error).__name__}: {error}") from None
        if not isinstance(header, dict):
            raise ChannelError("malformed message header: not a JSON object")
        nbytes = header.get("nbytes", 0)
        if not is_count(nbytes):
            raise ChannelError(f"malformed message header: nbytes={nbytes!r}")
        if nbytes > max_payload:
            raise ChannelError(f"message payload of {nbytes} bytes exceeds the {max_payload}-byte limit")
        payload = self._read_exact(nbytes, deadline) if nbytes else None
        return header, payload


# madvise(2) advice (Linux 5.14): fault every page of a range in, writable, now.
_MADV_POPULATE_WRITE = 23
_LIBC = ctypes.CDLL(None, use_errno=True)


class SharedArea:
    """A memory file (``memfd``) of ``size`` bytes shared by the parent and the child.

    The parent creates it (:meth:`create`) and passes :attr:`fd` to the child, which maps it once
    (:meth:`mapping`) and writes each payload at the offset the parent names; the parent copies a
    payload out into memory of its own (:meth:`read`), or, once the child is gone and nothing can
    write to the area any more, reads it in place (:meth:`view`).
    """

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size
        self._mapping: mmap.mmap | None = None

    @classmethod
    def create(cls, size: int) -> SharedArea | None:
        """A new area, or None where memory files are unavailable (then payloads use the pipe).

        Its size is sealed: a child that shrank it would make a read in place of a page past the
        end kill this process (SIGBUS), and one that grew it would hold memory beyond the bound.
        """
        if size <= 0 or not hasattr(os, "memfd_create") or not hasattr(fcntl, "F_ADD_SEALS"):
            return None
        fd = os.memfd_create("quasar-shared-output", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        return cls(fd, size)

    def mapping(self) -> mmap.mmap:
        """The area mapped into this process (once)."""
        if self._mapping is None:
            self._mapping = mmap.mmap(self.fd, self.size)
        return self._mapping

    def populate(self) -> None:
        """Allocate, zero and map every page of the area in this process now, without holding the
        GIL (a thread may do it while other work goes on): the child's copy into the area then
        finds its pages (about half of a 1 GiB copy's time on one core is faulting fresh pages
        in), and so do this process's reads in place. Where the kernel cannot (before Linux 5.14)
        the pages come at first touch as before."""
        try:
            anchor = ctypes.c_char.from_buffer(self.mapping())
        except (OSError, ValueError):
            return  # closed meanwhile: nothing left to populate
        try:
            _LIBC.madvise(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(self.size), _MADV_POPULATE_WRITE)
        finally:
            del anchor

    def _check(self, offset: int, nbytes: int) -> None:
        if not (0 <= offset and 0 <= nbytes and offset + nbytes <= self.size):
            raise ChannelError(
                f"a shared payload of {nbytes} bytes at offset {offset} does not fit the {self.size}-byte area"
            )

    def read(self, nbytes: int, offset: int = 0) -> bytearray:
        """A copy of ``nbytes`` bytes at ``offset``; ChannelError if they lie outside the area."""
        self._check(offset, nbytes)
        buffer = bytearray(nbytes)
        view = memoryview(buffer)
        filled = 0
        while filled < nbytes:
            count = os.preadv(self.fd, [view[filled:]], offset + filled)
            if count == 0:
                raise ChannelError(f"the shared area ends {filled} bytes into a payload of {nbytes}")
            filled += count
        return buffer

    def view(self, nbytes: int, offset: int = 0) -> memoryview:
        """The ``nbytes`` bytes at ``offset`` in place (no copy): only for an area no other process
        can write to any more."""
        self._check(offset, nbytes)
        return memoryview(self.mapping())[offset : offset + nbytes]

    def close(self) -> None:
        """Close the area; a mapping still viewed somewhere goes when its last view does."""
        if self._mapping is not None:
            try:
                self._mapping.close()
            except BufferError:
                pass
            self._mapping = None
        fd, self.fd = self.fd, -1  # a later mapping() fails instead of mapping whatever reuses the number
        os.close(fd)
