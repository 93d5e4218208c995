"""The channel and the shared area between the parent and the sandboxed child (quasar/evaluate/protocol.py)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import pytest

from quasar.evaluate import protocol


@pytest.fixture
def pipe_pair():
    a_read, b_write = os.pipe()
    b_read, a_write = os.pipe()
    yield protocol.Channel(a_read, a_write), protocol.Channel(b_read, b_write)
    for fd in (a_read, b_write, b_read, a_write):
        try:
            os.close(fd)
        except OSError:
            pass


def test_channel_carries_headers_and_large_payloads(pipe_pair):
    parent, child = pipe_pair
    payload = os.urandom(3 << 20)
    sender = threading.Thread(target=child.send, args=({"ok": True, "shape": [1, 2]}, payload))
    sender.start()
    header, received = parent.recv(deadline=time.monotonic() + 10, max_payload=len(payload))
    sender.join()
    assert header == {"ok": True, "shape": [1, 2], "nbytes": len(payload)}
    assert bytes(received) == payload


def test_a_shared_area_written_by_another_process_is_copied_out_or_read_in_place():
    area = protocol.SharedArea.create(1 << 20)
    try:
        payload, offset = os.urandom(300_000), random.randrange(1 << 19)
        writer = (
            "import mmap, os, sys; fd, at = int(sys.argv[1]), int(sys.argv[2]); "
            "area = mmap.mmap(fd, os.fstat(fd).st_size); data = sys.stdin.buffer.read(); "
            "area[at:at + len(data)] = data"
        )

        def write(data: bytes, at: int) -> None:
            subprocess.run(
                [sys.executable, "-c", writer, str(area.fd), str(at)], input=data, pass_fds=(area.fd,), check=True
            )

        write(payload, offset)
        copy = area.read(len(payload), offset)
        in_place = area.view(len(payload), offset)
        assert bytes(copy) == payload and bytes(in_place) == payload
        # The copy is this process's own; the view shows what the writer does next.
        write(b"\xff" * 1000, offset)
        assert bytes(copy) == payload and bytes(in_place[:1000]) == b"\xff" * 1000
        in_place.release()
        # Its size is sealed: another process can neither shrink it (a read in place past the end
        # would kill this one) nor grow it.
        resize = "import os, sys; os.ftruncate(int(sys.argv[1]), int(sys.argv[2]))"
        for size in (0, 1 << 21):
            refused = subprocess.run(
                [sys.executable, "-c", resize, str(area.fd), str(size)],
                pass_fds=(area.fd,),
                capture_output=True,
                text=True,
            )
            assert refused.returncode != 0 and "Operation not permitted" in refused.stderr
        assert os.fstat(area.fd).st_size == 1 << 20
        for nbytes, at in ((1 << 20, 1), ((1 << 20) + 1, 0), (10, -1)):
            with pytest.raises(protocol.ChannelError, match="does not fit the 1048576-byte area"):
                area.read(nbytes, at)
            with pytest.raises(protocol.ChannelError, match="does not fit"):
                area.view(nbytes, at)
    finally:
        area.close()
    assert protocol.SharedArea.create(0) is None


def test_channel_refuses_oversized_payload(pipe_pair):
    parent, child = pipe_pair
    child.send({"ok": True}, b"x" * 100)
    with pytest.raises(protocol.ChannelError, match="exceeds the 10-byte limit"):
        parent.recv(deadline=time.monotonic() + 5, max_payload=10)


@pytest.mark.parametrize(
    "raw,message",
    [
        ((5).to_bytes(4, "big") + b"{bad}", "malformed message header"),
        ((2).to_bytes(4, "big") + b"[]", "not a JSON object"),
        ((13).to_bytes(4, "big") + b'{"nbytes":-1}', "nbytes=-1"),
        ((15).to_bytes(4, "big") + b'{"nbytes":true}', "nbytes=True"),
        ((protocol.MAX_HEADER_BYTES + 1).to_bytes(4, "big"), "exceeds the"),
    ],
)
def test_channel_refuses_malformed_headers(pipe_pair, raw, message):
    parent, child = pipe_pair
    os.write(child.write_fd, raw)
    with pytest.raises(protocol.ChannelError, match=message):
        parent.recv(deadline=time.monotonic() + 5)


@pytest.mark.parametrize(
    "header,message",
    [
        (b'{"ok":true,"peak_bytes":' + b"1" * 5000 + b"}", "ValueError: Exceeds the limit"),
        (b"[" * 200_000, "RecursionError: maximum recursion depth exceeded"),
    ],
)
def test_a_header_that_breaks_the_decoder_is_the_other_sides_error(pipe_pair, header, message):
    # A fork writing a frame of its own onto the reply pipe: an integer of 5,000 digits (more than
    # Python converts) or arrays nested 200,000 deep made recv raise ValueError or RecursionError,
    # which evaluate() let out as a fault of the validator's own. The frame is read whole before
    # it is decoded, so the next one still comes through.
    parent, child = pipe_pair
    writer = threading.Thread(target=os.write, args=(child.write_fd, len(header).to_bytes(4, "big") + header))
    writer.start()
    with pytest.raises(protocol.ChannelError, match=f"malformed message header: {message}"):
        parent.recv(deadline=time.monotonic() + 5)
    writer.join()
    child.send({"op": "next"})
    assert parent.recv(deadline=time.monotonic() + 5)[0] == {"op": "next", "nbytes": 0}


def test_channel_deadline_and_closed_peer(pipe_pair):
    parent, child = pipe_pair
    started = time.monotonic()
    with pytest.raises(protocol.ChannelTimeout):
        parent.recv(deadline=time.monotonic() + 0.2)
    assert 0.15 < time.monotonic() - started < 2
    os.close(child.write_fd)
    with pytest.raises(protocol.ChannelClosed):
        parent.recv(deadline=time.monotonic() + 5)


@pytest.mark.parametrize("spin", [0.0, 0.3])
def test_channel_waits_by_spinning_or_sleeping_alike(pipe_pair, spin):
    parent, child = pipe_pair
    parent.spin_seconds = spin
    threading.Timer(0.1, child.send, args=({"op": "late"},)).start()
    assert parent.recv(deadline=time.monotonic() + 5)[0] == {"op": "late", "nbytes": 0}
    started = time.monotonic()
    with pytest.raises(protocol.ChannelTimeout):
        parent.recv(deadline=time.monotonic() + 0.5)
    assert 0.45 < time.monotonic() - started < 2


def test_a_populated_area_has_every_page_and_a_closed_one_is_left_alone():
    area = protocol.SharedArea.create(8 << 20)
    assert os.fstat(area.fd).st_blocks == 0
    area.populate()
    assert os.fstat(area.fd).st_blocks * 512 >= 8 << 20
    assert bytes(area.read(4096, (8 << 20) - 4096)) == bytes(4096)
    area.close()
    closed = protocol.SharedArea.create(1 << 20)
    closed.close()
    closed.populate()  # nothing to do, and no error: the area is gone
