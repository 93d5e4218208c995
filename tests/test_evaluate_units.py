"""Unit tests of the evaluation harness's parts: no sandbox, no fork, fast.

Each fast path (fingerprints, block errors, the output capture) is compared with a slow,
obviously correct version on fresh random inputs.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import signal
import statistics
import struct
import subprocess
import sys
import threading
import time

import pytest
import torch

from quasar.evaluate import harness, protocol, start, workload
from quasar.evaluate.__main__ import main as evaluate_main
from quasar.evaluate.__main__ import parse_seq_lens
from quasar.evaluate.harness import (
    CPU_MAX_SEQ_LEN,
    FINGERPRINT_TOLERANCE,
    REL_ERROR_THRESHOLD,
    EvaluationInputError,
    check_lengths,
    fingerprint_error,
    worst_block_error,
)
from quasar.evaluate.report import EvaluationReport, ImportCheck, LengthResult, Timings
from quasar.evaluate.sandbox import (
    KEPT_OUTPUT_BYTES,
    MARKER_VARIABLE,
    CapturedOutput,
    SandboxError,
    SandboxPolicy,
    _copy_tree,
    _python_installation,
    kill_marked_processes,
    scrubbed_environment,
)
from quasar.reference import QuasarAttentionReference, relative_error

# --- workload: what both sides of the sandbox make from seeds ---------------------------------


def test_weights_are_deterministic_and_fit_the_reference_layer():
    first, again, other = workload.make_weights(7), workload.make_weights(7), workload.make_weights(8)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["q_proj.weight"], other["q_proj.weight"])
    assert {name: tuple(t.shape) for name, t in first.items()} == workload.PARAMETER_SHAPES
    assert sum(t.numel() for t in first.values()) == 1_120_840
    layer = QuasarAttentionReference(**workload.LAYER_KWARGS)
    layer.load_state_dict(first, strict=True)
    beta = torch.nn.functional.softplus(first["beta_log"])
    assert bool(((beta > 1) & (beta < 16.1)).all())


def naive_noise(seed: int, count: int, length: int) -> torch.Tensor:
    return torch.randn(count, length, 512, generator=torch.Generator().manual_seed(seed))


def filled(count: int, length: int, input_seed: int, basis_seed: int) -> workload.RequestBuffers:
    buffers = workload.RequestBuffers.allocate(count, length, "cpu")
    workload.fill_request(buffers, input_seed, basis_seed)
    return buffers


def test_request_buffers_come_from_their_seeds_alone():
    rng = random.Random()
    seeds = [rng.randrange(1 << 63) for _ in range(3)]
    count, length = rng.randint(1, 4), rng.randint(8, 300)
    first = filled(count, length, seeds[0], seeds[1])
    again = workload.RequestBuffers.allocate(count, length, "cpu")
    workload.fill_request(again, seeds[2], seeds[2])
    workload.fill_request(again, seeds[0], seeds[1])
    for name in ("noise", "directions", "token_weights"):
        assert torch.equal(getattr(first, name), getattr(again, name)), name
    # The noise is torch.randn from the input seed; the bases do not depend on it.
    assert torch.equal(first.noise, naive_noise(seeds[0], count, length))
    other_input = filled(count, length, seeds[2], seeds[1])
    assert not torch.equal(other_input.noise, first.noise)
    assert torch.equal(other_input.directions, first.directions)
    assert torch.equal(other_input.token_weights, first.token_weights)
    other_basis = filled(count, length, seeds[0], seeds[2])
    assert torch.equal(other_basis.noise, first.noise) and not torch.equal(other_basis.directions, first.directions)


@pytest.mark.parametrize("length", [8, 77, 512])
def test_token_weights_are_a_random_sign_on_each_eighth_and_zero_elsewhere(length):
    buffers = filled(3, length, random.randrange(1 << 63), random.randrange(1 << 63))
    assert set(buffers.directions.unique().tolist()) == {-1.0, 1.0}
    for index in range(3):
        weights = buffers.token_weights[index]
        for row, (start, stop) in enumerate(workload.segment_bounds(length)):
            inside = weights[row, start:stop]
            assert set(inside.unique().tolist()) <= {-1.0, 1.0}
            assert float(weights[row].abs().sum()) == stop - start
        # One sign per token, whichever row holds it.
        assert set(weights.sum(0).abs().unique().tolist()) == {1.0}
    if length >= 77:
        assert not torch.equal(buffers.token_weights[0], buffers.token_weights[1])


@pytest.mark.parametrize("length", [8, 64, 100, 1000, 100_000])
def test_segment_bounds_cover_the_sequence_in_eight_nearly_equal_parts(length):
    bounds = workload.segment_bounds(length)
    assert len(bounds) == 8 and bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(stop == next_start for (_, stop), (next_start, _) in itertools.pairwise(bounds))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1


def naive_fingerprint(output: torch.Tensor, directions: torch.Tensor, token_weights: torch.Tensor) -> torch.Tensor:
    directions, weights = directions.double(), token_weights.double()
    flat = output.reshape(-1, output.shape[-1]).double()
    rows = []
    for row, (start, stop) in enumerate(workload.segment_bounds(flat.shape[0])):
        rows.append([sum(float(weights[row, t]) * float(flat[t] @ directions[:, j]) for t in range(start, stop))
                     for j in range(directions.shape[1])])
    return torch.tensor(rows, dtype=torch.float64)


def naive_signs(values: list) -> list[int]:
    """signs_from_fingerprint in plain Python from the reported floats, as the rule says."""
    signs = []
    for value in itertools.chain.from_iterable(row[:workload.SIGN_DIRECTIONS] for row in values):
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        product = (bits * 0x2545F491) % (1 << 32)
        signs += [-1 if (product >> shift) & 1 else 1 for shift in (28, 29, 30, 31)]
    return signs


@pytest.mark.parametrize("seed", range(3))
def test_fingerprint_matches_the_naive_sum(seed):
    generator = torch.Generator().manual_seed(seed)
    length = int(torch.randint(8, 40, (1,), generator=generator))
    output = torch.randn(1, length, 512, generator=generator)
    buffers = filled(2, length, seed, seed + 100)
    for index in range(2):
        directions, weights = buffers.directions[index], buffers.token_weights[index]
        fast = workload.fingerprint(output, directions, weights).double()
        assert fast.shape == (8, workload.FINGERPRINT_DIRECTIONS)
        assert torch.allclose(fast, naive_fingerprint(output, directions, weights), rtol=1e-4, atol=1e-3)


def test_signs_are_the_rule_recomputed_from_the_reported_floats():
    rng = random.Random()
    special = [0.0, -0.0, 1.0, -1.0, 1e-45, -3e-39, 3.4e38, float("inf"), float("-inf")]
    for trial in range(20):
        values = torch.randn(8, workload.FINGERPRINT_DIRECTIONS) * 10 ** rng.uniform(-6, 6)
        if trial % 4 == 0:
            values.view(-1)[: len(special)] = torch.tensor(special)
        signs = workload.signs_from_fingerprint(values)
        assert signs.shape == (512,) and signs.tolist() == naive_signs(values.tolist())
        # What the parent rebuilds from the reply's bytes is what the child computed from its tensor.
        received = torch.frombuffer(bytearray(memoryview(values.numpy()).cast("B")), dtype=torch.float32)
        assert torch.equal(workload.signs_from_fingerprint(received.reshape(values.shape)), signs)
    # One unit in the last place of one value the signs are drawn from changes its four signs.
    values = torch.randn(8, workload.FINGERPRINT_DIRECTIONS)
    changed = 0
    for position in [row * workload.FINGERPRINT_DIRECTIONS + column for row in range(8)
                     for column in range(workload.SIGN_DIRECTIONS)]:
        nudged = values.clone()
        nudged.view(-1)[position] = torch.nextafter(nudged.view(-1)[position], torch.tensor(math.inf))
        changed += not torch.equal(workload.signs_from_fingerprint(nudged), workload.signs_from_fingerprint(values))
    assert changed > 0.8 * workload.SIGN_VALUES


class RecordingLayer:
    """A deterministic non-linear stand-in for the layer (bf16 output) that keeps every input it saw."""

    def __init__(self, seed: int):
        self.weight = torch.randn(512, 512, generator=torch.Generator().manual_seed(seed)) / 512 ** 0.5
        self.inputs: list[torch.Tensor] = []

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        self.inputs.append(hidden.clone())
        return torch.tanh(hidden @ self.weight).bfloat16()


def test_run_forwards_matches_a_slow_per_forward_chain_and_the_parents_rebuild():
    from quasar.evaluate.harness import _reference_outputs, _Request

    rng = random.Random()
    count, length = rng.randint(2, 5), rng.randint(8, 48)
    input_seed, basis_seed = rng.randrange(1 << 63), rng.randrange(1 << 63)
    buffers = filled(count, length, input_seed, basis_seed)
    layer_seed = rng.randrange(1 << 30)
    layer = RecordingLayer(layer_seed)
    last = workload.run_forwards(layer, buffers)
    reported = buffers.fingerprints.tolist()
    assert torch.equal(last, torch.tanh(layer.inputs[-1] @ layer.weight).bfloat16())

    # The slow chain: the noise from torch.randn, the signs in plain Python from the floats sent.
    noise = naive_noise(input_seed, count, length)
    for index in range(count):
        expected_input = noise[index] if index == 0 else noise[index] * torch.tensor(naive_signs(reported[index - 1]))
        assert torch.equal(layer.inputs[index], expected_input.unsqueeze(0)), index
        output = torch.tanh(expected_input @ layer.weight).bfloat16()
        expected = naive_fingerprint(output, buffers.directions[index], buffers.token_weights[index])
        # The fast path rounds each token's projection to the output's bfloat16 (a few 1e-3 of an
        # eighth's scale); a wrong input, basis or row would be off by about 1.
        assert fingerprint_error(reported[index], expected, workload.segment_norms(output)) < 1e-2

    # The parent rebuilds each input from the seeds and the reply's bytes (an identity "reference" returns it).
    payload = bytearray(memoryview(buffers.fingerprints.numpy()).cast("B"))
    request = _Request(input_seed, basis_seed, harness._fingerprints(payload, count, "test"), 0)
    assert request.fingerprints.tolist() == reported
    rebuilt = harness._request_buffers(request, length, "cpu")
    inputs = _reference_outputs(lambda batch: (batch,), rebuilt, request, 0, count)
    assert torch.equal(inputs, torch.cat(layer.inputs))

    # count=1 (the capture's eager pass): the first forward alone, with the same fingerprint.
    first_only = RecordingLayer(layer_seed)
    again = filled(count, length, input_seed, basis_seed)
    workload.run_forwards(first_only, again, count=1)
    assert len(first_only.inputs) == 1 and torch.equal(first_only.inputs[0], layer.inputs[0])
    assert again.fingerprints[0].tolist() == reported[0] and not again.fingerprints[1:].any()


def test_a_batched_reference_matches_one_forward_at_a_time():
    from quasar.evaluate.harness import _reference_outputs, _Request

    rng = random.Random()
    count, length = rng.randint(2, 4), rng.randint(64, 200)
    reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
    reference.load_state_dict(workload.make_weights(rng.randrange(1 << 30)), strict=True)
    buffers = filled(count, length, rng.randrange(1 << 63), rng.randrange(1 << 63))
    request = _Request(0, 0, torch.randn(count, workload.SEGMENTS, workload.FINGERPRINT_DIRECTIONS), 0)
    batched = _reference_outputs(reference, buffers, request, 0, count)
    one_at_a_time = torch.cat([_reference_outputs(reference, buffers, request, index, index + 1)
                               for index in range(count)])
    assert batched.shape == (count, length, workload.HIDDEN_SIZE)
    assert relative_error(batched, one_at_a_time) < 1e-5


def test_the_parents_batched_checks_match_one_forward_at_a_time():
    # The parent's fast path (a batch of forwards' inputs, fingerprints, norms and signs at once)
    # against the per-forward functions the child runs, on fresh random outputs and bases.
    rng = random.Random()
    count, length = rng.randint(2, 6), rng.randint(8, 300)
    buffers = filled(count, length, rng.randrange(1 << 63), rng.randrange(1 << 63))
    reported = torch.randn(count, workload.SEGMENTS, workload.FINGERPRINT_DIRECTIONS)
    outputs = torch.randn(count, length, workload.HIDDEN_SIZE)
    singles = torch.stack([workload.fingerprint(outputs[i:i + 1], buffers.directions[i], buffers.token_weights[i])
                           for i in range(count)])
    assert relative_error(workload.fingerprints_of(outputs, buffers.directions, buffers.token_weights), singles) < 1e-6
    assert relative_error(workload.segment_norms_of(outputs),
                          torch.stack([workload.segment_norms(outputs[i:i + 1]) for i in range(count)])) < 1e-6
    assert torch.equal(workload.signs_from_fingerprint(reported),
                       torch.stack([workload.signs_from_fingerprint(values) for values in reported]))
    start = rng.randrange(count)
    stop = rng.randint(start + 1, count)
    one_by_one = torch.cat([workload.forward_input(buffers.noise[i], reported[i - 1] if i else None)
                            for i in range(start, stop)])
    assert torch.equal(workload.chained_inputs(buffers.noise, reported, start, stop), one_by_one)


def test_each_input_exists_only_after_the_previous_fingerprint():
    buffers = filled(3, 64, 1, 2)
    workload.run_forwards(lambda hidden: hidden.bfloat16(), buffers)
    first_signs = workload.signs_from_fingerprint(buffers.fingerprints[0])
    nudged = buffers.fingerprints[0].clone()
    nudged[0, 0] = torch.nextafter(nudged[0, 0], torch.tensor(math.inf))
    assert not torch.equal(workload.forward_input(buffers.noise[1], nudged),
                           workload.forward_input(buffers.noise[1], buffers.fingerprints[0]))
    assert torch.equal(workload.forward_input(buffers.noise[1], buffers.fingerprints[0])[0],
                       buffers.noise[1] * first_signs)
    assert torch.equal(workload.forward_input(buffers.noise[0], None)[0], buffers.noise[0])


def test_fingerprint_of_bfloat16_output_is_close_to_float32():
    output = torch.randn(1, 256, 512)
    buffers = filled(1, 256, 4, 5)
    basis = (buffers.directions[0], buffers.token_weights[0])
    error = fingerprint_error(workload.fingerprint(output.bfloat16(), *basis).tolist(),
                              workload.fingerprint(output, *basis), workload.segment_norms(output))
    # bfloat16 rounding of the output itself (about 2^-9 relative) is all that separates them.
    assert error < 0.01


def test_a_change_in_one_eighth_moves_only_its_row_and_a_nan_poisons_all():
    output = torch.randn(1, 64, 512)
    buffers = filled(1, 64, 1, 2)
    basis = (buffers.directions[0], buffers.token_weights[0])
    changed = output.clone()
    changed[0, 40, 17] += 100.0
    moved = (workload.fingerprint(changed, *basis) != workload.fingerprint(output, *basis)).any(1)
    assert moved.tolist() == [False] * 5 + [True] + [False] * 2
    changed[0, 40, 17] = float("nan")
    assert not bool(torch.isfinite(workload.fingerprint(changed, *basis)).any())


def test_fingerprint_error_estimates_the_error_of_each_eighth():
    generator = torch.Generator().manual_seed(11)
    reference = torch.randn(1, 2048, 512, generator=generator)
    norms = workload.segment_norms(reference)
    buffers = filled(5, 2048, 99, 100)
    for trial in range(5):
        basis = (buffers.directions[trial], buffers.token_weights[trial])
        expected = workload.fingerprint(reference, *basis)
        # An honest output with a 1% error: estimated within the chi-square(16) spread.
        honest = reference + 0.01 * torch.randn(reference.shape, generator=generator) * reference.std()
        estimate = fingerprint_error(workload.fingerprint(honest, *basis).tolist(), expected, norms)
        assert 0.004 < estimate < FINGERPRINT_TOLERANCE
        # Zeros on the last eighth only: that eighth's error is 1.
        wrong = reference.clone()
        wrong[:, 1792:] = 0
        assert fingerprint_error(workload.fingerprint(wrong, *basis).tolist(), expected, norms) > 0.4


def test_fingerprint_error_refuses_malformed_claims():
    expected = torch.ones(8, workload.FINGERPRINT_DIRECTIONS)
    norms = torch.ones(8)
    assert fingerprint_error("not a list", expected, norms) == math.inf
    assert fingerprint_error([[1.0] * 3] * 8, expected, norms) == math.inf
    assert fingerprint_error([[float("nan")] * 16] * 8, expected, norms) == math.inf
    assert fingerprint_error(expected.tolist(), expected, norms) == 0.0


def naive_worst_block_error(output: torch.Tensor, reference: torch.Tensor, block: int) -> float:
    out = output.reshape(-1, output.shape[-1]).double()
    ref = reference.reshape(-1, reference.shape[-1]).double()
    mean_square = float((ref ** 2).sum()) / ref.shape[0]
    worst = 0.0
    for start in range(0, out.shape[0], block):
        part = slice(start, min(start + block, out.shape[0]))
        tokens = part.stop - part.start
        worst = max(worst, math.sqrt(float(((out[part] - ref[part]) ** 2).sum()) / (tokens * mean_square)))
    return worst


@pytest.mark.parametrize("length,block", [(64, 64), (200, 64), (1000, 16), (77, 10)])
def test_worst_block_error_matches_the_naive_loop(length, block):
    generator = torch.Generator().manual_seed(length)
    reference = torch.randn(1, length, 32, generator=generator)
    output = reference + 0.05 * torch.randn(reference.shape, generator=generator)
    output[0, length // 3] += 3.0
    assert worst_block_error(output, reference, block) == pytest.approx(
        naive_worst_block_error(output, reference, block), rel=1e-9)


def test_a_wrong_tail_that_an_eighth_would_dilute_is_caught_by_blocks():
    # 2M tokens: the last 64 wrong is 1/4096 of an eighth, an eighth's error of only 0.0156.
    reference = torch.randn(1, 2_000_000, 2, generator=torch.Generator().manual_seed(0))
    output = reference.clone()
    output[:, -64:] = 0
    last = workload.segment_bounds(2_000_000)[-1]
    eighth = float((output[:, last[0]:] - reference[:, last[0]:]).norm() / reference[:, last[0]:].norm())
    assert eighth < REL_ERROR_THRESHOLD
    assert worst_block_error(output, reference) == pytest.approx(1.0, rel=0.05)


# --- the channel -----------------------------------------------------------------------------


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
        writer = ("import mmap, os, sys; fd, at = int(sys.argv[1]), int(sys.argv[2]); "
                  "area = mmap.mmap(fd, os.fstat(fd).st_size); data = sys.stdin.buffer.read(); "
                  "area[at:at + len(data)] = data")

        def write(data: bytes, at: int) -> None:
            subprocess.run([sys.executable, "-c", writer, str(area.fd), str(at)], input=data, pass_fds=(area.fd,),
                           check=True)

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
            refused = subprocess.run([sys.executable, "-c", resize, str(area.fd), str(size)], pass_fds=(area.fd,),
                                     capture_output=True, text=True)
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


@pytest.mark.parametrize("raw,message", [
    ((5).to_bytes(4, "big") + b"{bad}", "malformed message header"),
    ((2).to_bytes(4, "big") + b"[]", "not a JSON object"),
    ((13).to_bytes(4, "big") + b'{"nbytes":-1}', "nbytes=-1"),
    ((protocol.MAX_HEADER_BYTES + 1).to_bytes(4, "big"), "exceeds the"),
])
def test_channel_refuses_malformed_headers(pipe_pair, raw, message):
    parent, child = pipe_pair
    os.write(child.write_fd, raw)
    with pytest.raises(protocol.ChannelError, match=message):
        parent.recv(deadline=time.monotonic() + 5)


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


# --- the sandbox's parent side ---------------------------------------------------------------


def naive_capture_text(chunks: list[bytes]) -> str:
    data = b"".join(chunks)
    head, rest = data[:KEPT_OUTPUT_BYTES], data[KEPT_OUTPUT_BYTES:]
    tail = rest[-KEPT_OUTPUT_BYTES:]
    skipped = len(rest) - len(tail)
    middle = f"\n[... {skipped} bytes left out ...]\n".encode() if skipped > 0 else b""
    return (head + middle + tail).decode("utf-8", errors="replace")


@pytest.mark.parametrize("seed", range(4))
def test_captured_output_keeps_head_and_tail_like_the_naive_version(seed):
    generator = torch.Generator().manual_seed(seed)
    chunks = []
    for _ in range(int(torch.randint(1, 40, (1,), generator=generator))):
        size = int(torch.randint(0, 9000, (1,), generator=generator))
        chunks.append(bytes(torch.randint(97, 123, (size,), generator=generator, dtype=torch.uint8).tolist()))
    captured = CapturedOutput()
    for chunk in chunks:
        captured.add(chunk)
    assert captured.total_bytes == sum(map(len, chunks))
    assert captured.text() == naive_capture_text(chunks)


def test_scrubbed_environment_keeps_no_secret(monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    monkeypatch.setenv("WALLET_PATH", "/root/.bittensor/wallets")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    env = scrubbed_environment("/sandbox/home", "cuda:1", SandboxPolicy(), "abc")
    assert not any("secret" in value.lower() or "bittensor" in value for value in env.values())
    assert "GITHUB_TOKEN" not in env and "WALLET_PATH" not in env
    assert env["HOME"] == "/sandbox/home" and env["TMPDIR"] == "/sandbox/home/tmp"
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    assert env[MARKER_VARIABLE] == "abc"
    assert scrubbed_environment("/h", "cpu", SandboxPolicy(), "m")["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(SandboxError, match="has no device 2"):
        scrubbed_environment("/h", "cuda:2", SandboxPolicy(), "m")


def test_copying_a_fork_skips_git_and_links_leaving_it(tmp_path, monkeypatch):
    source = tmp_path / "fork"
    (source / ".git").mkdir(parents=True)
    (source / ".git" / "config").write_text("[credential] token")
    (source / "fla").mkdir()
    (source / "fla" / "a.py").write_text("x = 1")
    os.chmod(source / "fla" / "a.py", 0o600)
    (source / "fla" / "inside.py").symlink_to(source / "fla" / "a.py")
    (source / "fla" / "escape").symlink_to("/etc/passwd")
    _copy_tree(source, tmp_path / "copy")
    copied = tmp_path / "copy"
    assert not (copied / ".git").exists()
    assert (copied / "fla" / "a.py").read_text() == "x = 1"
    assert oct((copied / "fla" / "a.py").stat().st_mode & 0o777) == "0o644"
    assert (copied / "fla" / "inside.py").is_symlink() and not (copied / "fla" / "escape").exists()
    monkeypatch.setattr("quasar.evaluate.sandbox.MAX_FORK_BYTES", 2)
    with pytest.raises(SandboxError, match="larger than"):
        _copy_tree(source, tmp_path / "copy2")


def test_processes_carrying_the_marker_are_killed():
    marker = f"unit-{os.getpid()}"
    env = dict(os.environ, **{MARKER_VARIABLE: marker})
    escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)
    try:
        time.sleep(0.2)
        assert kill_marked_processes(marker, grace_seconds=0.1) == 1
        assert escaped.wait(timeout=5) == -signal.SIGKILL
        assert kill_marked_processes(marker, grace_seconds=0.1) == 0
    finally:
        escaped.kill()


# --- arguments and report --------------------------------------------------------------------


def test_lengths_are_checked():
    assert check_lengths((1024, 512), 2048, "cuda") == [512, 1024, 2048]
    assert check_lengths((512,), 512, "cpu") == [512]
    for bad, message in [((32,), "from 64"), ((True,), "from 64"), ((CPU_MAX_SEQ_LEN + 1,), "CPU runs are limited")]:
        with pytest.raises(EvaluationInputError, match=message):
            check_lengths(bad, 512, "cpu")


def test_seq_lens_parse_with_suffixes():
    assert parse_seq_lens("512, 1k,2_048,1M") == (512, 1000, 2048, 1_000_000)
    with pytest.raises(Exception, match="comma-separated"):
        parse_seq_lens("512,abc")


def test_command_line_refuses_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate_main([str(tmp_path / "missing"), "--target", "512", "--device", "cpu"])
    assert exit_info.value.code == 2
    assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        evaluate_main([str(tmp_path), "--target", "512", "--claimed", "-5"])
    assert exit_info.value.code == 2
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exit_info:
            evaluate_main([str(tmp_path), "--target", "512", "--device", "cuda"])
        assert exit_info.value.code == 2
        assert "CUDA is not available here" in capsys.readouterr().err


def test_report_round_trips_through_json_and_drops_non_finite_numbers():
    report = EvaluationReport(
        verdict="fail", reasons=["T=64: the output has NaN or infinite values"], repo="/r", target_seq_len=64,
        seq_lens=[64], device="cpu", device_name="cpu", import_check=ImportCheck(ok=True, profile="core"),
        lengths={"64": LengthResult(seq_len=64, status="ok", rel_error=math.inf, rel_error_eighths=[math.nan] * 8,
                                    finite=False, correct=False)},
        timings=Timings(total_s=3.0, timed_s=1.0),
    )
    import json

    data = json.loads(report.to_json())
    assert data["lengths"]["64"]["rel_error"] is None and data["lengths"]["64"]["rel_error_eighths"] == [None] * 8
    assert data["timings"]["overhead_s"] == 2.0
    again = EvaluationReport.from_dict(data)
    assert again.reasons == report.reasons and again.lengths["64"].finite is False
    assert again.import_check == report.import_check and again.timings.total_s == 3.0


# --- verification in the parent (no sandbox: the runs are made here) ---------------------------


def child_request(reference: torch.nn.Module, length: int, seeds: tuple[int, int], count: int, fake_after_first=False):
    """What the child sends for a ``run`` request (the chained forwards of workload.run_forwards
    through the reference layer, bf16 outputs: the fingerprints' bytes), and the last output.
    ``fake_after_first``: forwards after the first return zeros, as a fork skipping them would."""
    buffers = filled(count, length, *seeds)
    calls = []

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        calls.append(len(calls))
        if fake_after_first and len(calls) > 1:
            return torch.zeros(1, length, 512, dtype=torch.bfloat16)
        with torch.inference_mode():
            return reference(hidden)[0].bfloat16()

    output = workload.run_forwards(forward, buffers)
    return bytearray(memoryview(buffers.fingerprints.numpy()).cast("B")), output


def honest_run(reference: torch.nn.Module, length: int, timed: int = 3, count: int = 1, fake_after_first=False):
    """A _LengthRun as the parent builds it from an honest (or first-only) fork's replies."""
    from quasar.evaluate.harness import LengthResult, _fingerprints, _LengthRun, _Request

    def request(seeds: tuple[int, int], count: int, fake=False):
        payload, output = child_request(reference, length, seeds, count, fake)
        return _Request(*seeds, _fingerprints(payload, count, "test"), 1_000_000 * count, 1_000_000), output

    run = _LengthRun(LengthResult(seq_len=length, status="ok", forwards_per_request=count))
    run.timed = [request((10 + i, 20 + i), count, fake_after_first)[0] for i in range(timed)]
    # The correctness request is a timed request like the others, its output the last forward's.
    run.check, run.output = request((1, 2), count, fake_after_first)
    run.timed.insert(timed // 2, run.check)
    run.repeat = request((1, 2), count, fake_after_first)[0]
    return run


def test_verification_passes_an_honest_run_and_reports_an_unverifiable_length(monkeypatch):
    from quasar.evaluate import harness

    reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
    reference.load_state_dict(workload.make_weights(5), strict=True)
    runs = {64: honest_run(reference, 64), 128: honest_run(reference, 128)}
    real_reference_outputs = harness._reference_outputs

    def out_of_memory_at_128(reference, buffers, request, start, stop):
        if buffers.seq_len == 128:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_reference_outputs(reference, buffers, request, start, stop)

    monkeypatch.setattr(harness, "_reference_outputs", out_of_memory_at_128)
    reasons = harness._verify(runs, harness.ReferenceWork(5, "cpu", [], {}), Timings(), lambda event: None, 128)
    assert runs[64].result.correct is True and runs[64].result.runs_verified == 4
    assert runs[64].result.rel_error < 5e-3 and runs[64].result.repeat_agree
    assert runs[128].result.correct is False
    assert reasons == [("T=128: the float32 reference does not fit in the memory of cpu here, so this length "
                        "cannot be verified on this machine")]


def test_the_longest_length_checked_beside_the_others_gets_the_same_verdicts(monkeypatch):
    from quasar.evaluate import harness

    reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
    reference.load_state_dict(workload.make_weights(6), strict=True)

    def make_runs() -> dict:
        # 96 tokens: a fork that skips every forward of a request but the first.
        return {64: honest_run(reference, 64), 96: honest_run(reference, 96, count=2, fake_after_first=True),
                128: honest_run(reference, 128)}

    serial_runs, beside_runs = make_runs(), make_runs()
    serial = harness._verify(serial_runs, harness.ReferenceWork(6, "cpu", [], {}), Timings(), lambda event: None, 128,
                             longest_beside=False)
    # The longest runs out of memory beside the others once; it is checked again alone.
    real_verify_length = harness._verify_length
    threads, failed_once = [], []

    def verify_length(run, *args, **kwargs):
        threads.append((run.result.seq_len, threading.current_thread().name))
        if run.result.seq_len == 128 and not failed_once:
            failed_once.append(True)
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_verify_length(run, *args, **kwargs)

    monkeypatch.setattr(harness, "_verify_length", verify_length)
    beside = harness._verify(beside_runs, harness.ReferenceWork(6, "cpu", [], {}), Timings(), lambda event: None, 128,
                             longest_beside=True)
    # 96's forwards after the first of each request are zeros, its correctness request's too.
    assert serial == beside and serial and all(reason.startswith("T=96: ") for reason in serial)
    for length in (64, 96, 128):
        serial_result, beside_result = serial_runs[length].result, beside_runs[length].result
        # Which timed requests were drawn differs between the two; all were checked, so no figure does.
        assert serial_result == beside_result, length
        assert beside_runs[length].output is None
    assert beside_runs[128].result.correct is True and beside_runs[96].result.correct is False
    # First on a thread of its own, then again alone on the evaluation's thread, after the others.
    assert [name for length, name in threads if length == 128] == ["quasar-verify-longest",
                                                                   threading.current_thread().name]
    assert threads[-1][0] == 128


def test_correctness_references_computed_ahead_are_those_of_the_runs_the_child_makes():
    # The parent computes each length's correctness reference on a thread while the child starts,
    # from seeds drawn before the child exists; a run made with those seeds verifies against it
    # as it would against one computed afterwards, and a run with other seeds does not.
    from quasar.evaluate import harness

    references = harness.ReferenceWork(7, "cpu", [64, 96], {64: 1, 96: 1})
    reference = references.wait()
    assert sorted(references.expected) == [64, 96] and len(set(references.check_seeds.values())) == 2
    for length, seeds in references.check_seeds.items():
        buffers = filled(1, length, *seeds)
        with torch.inference_mode():
            assert torch.equal(references.expected[length], reference(buffers.noise[0:1])[0])
    runs = {length: honest_run(reference, length) for length in (64, 96)}
    for length, run in runs.items():
        seeds = references.check_seeds[length]
        # At 96 the child runs the correctness run on another input than the seeds it was sent.
        used = seeds if length == 64 else (seeds[0] + 1, seeds[1])
        payload, run.output = child_request(reference, length, used, 1)
        run.timed.remove(run.check)
        run.check = harness._Request(*seeds, harness._fingerprints(payload, 1, "test"), 1)
        run.timed.append(run.check)
        run.repeat = run.check
    reasons = harness._verify(runs, references, Timings(), lambda event: None, 96)
    assert runs[64].result.correct is True and runs[64].result.rel_error < 5e-3
    assert runs[96].result.correct is False and runs[96].result.rel_error > 0.3
    assert any(reason.startswith("T=96: the output differs from the reference") for reason in reasons)
    assert references.expected == {}


def test_the_rehearsal_checks_a_made_up_batch_as_a_timed_request_is_checked(monkeypatch):
    from quasar.evaluate import harness

    references = harness.ReferenceWork(3, "cpu", [64], {64: 1})
    references.wait()
    batches = []
    real = harness._reference_outputs

    def recording(reference, buffers, request, start, stop):
        batches.append((buffers.seq_len, stop - start, tuple(request.fingerprints.shape)))
        return real(reference, buffers, request, start, stop)

    monkeypatch.setattr(harness, "_reference_outputs", recording)
    monkeypatch.setattr(harness, "MAX_FORWARDS_PER_REQUEST", 4)  # a request's most; small for the CPU
    references._rehearse(64)
    assert batches == [(64, 4, (4, 8, workload.FINGERPRINT_DIRECTIONS))]
    assert sorted(references.expected) == [64]


def test_the_parent_takes_one_fingerprint_per_forward_from_the_reply():
    from quasar.evaluate.harness import _ChildFailure, _fingerprints

    values = torch.randn(4, 8, workload.FINGERPRINT_DIRECTIONS)
    payload = bytearray(memoryview(values.numpy()).cast("B"))
    assert torch.equal(_fingerprints(payload, 4, "test"), values)
    with pytest.raises(_ChildFailure, match=f"1536 bytes of fingerprints for 4 forwards, expected {4 * 8 * 4 * workload.FINGERPRINT_DIRECTIONS}"):
        _fingerprints(payload[:1536], 4, "test")
    with pytest.raises(_ChildFailure, match="0 bytes of fingerprints for 1 forwards"):
        _fingerprints(None, 1, "test")


@pytest.mark.parametrize(("length", "tokens", "cap", "expected"), [
    (512, 1 << 18, 64, 64),
    (1024, 1 << 18, 64, 64),
    (2048, 1 << 18, 64, 64),
    (8192, 1 << 18, 64, 32),
    (100_000, 1 << 18, 64, 3),
    (1_000_000, 1 << 18, 64, 1),
    (512, 1 << 18, 256, 256),
    (1 << 20, 1 << 22, 64, 2),
    (512, 0, 64, 1),
    (512, 5000, 64, 10),
])
def test_forwards_per_request_depend_on_the_length_alone(length, tokens, cap, expected):
    from quasar.evaluate.harness import MAX_TOKENS_PER_REQUEST, forwards_per_request

    count = forwards_per_request(length, tokens, cap)
    assert count == expected
    assert 1 <= count <= cap and (count == 1 or count * length <= MAX_TOKENS_PER_REQUEST)
    if 1 < count < min(cap, MAX_TOKENS_PER_REQUEST // length):
        assert count * length >= tokens > (count - 1) * length


@pytest.mark.parametrize("trial", range(20))
def test_timed_rounds_meet_the_bounds_on_the_total_and_share_the_time(trial):
    from dataclasses import replace

    from quasar.evaluate.harness import TIMED_ROUNDS, EvaluationOptions, round_quota

    rng = random.Random()
    least_total = rng.randint(1, 30)
    options = replace(EvaluationOptions(), min_timed_runs=least_total, max_timed_runs=rng.randint(least_total, 300),
                      timed_seconds=rng.uniform(0.1, 5.0))
    request_s = rng.choice([1e-4, 1e-3, 0.02, 0.5, 3.0])
    done = 0
    for round_index in range(TIMED_ROUNDS):
        least, planned = round_quota(options, request_s, done, TIMED_ROUNDS - round_index)
        assert 0 <= least <= planned
        # A round runs between its least and its planned number (the wall clock ends it in between).
        done += rng.randint(least, planned)
    assert options.min_timed_runs <= done <= options.max_timed_runs
    # Unhurried rounds run the share of the time that fits, within the bounds.
    done = 0
    for round_index in range(TIMED_ROUNDS):
        done += round_quota(options, request_s, done, TIMED_ROUNDS - round_index)[1]
    fits = math.ceil(options.timed_seconds / TIMED_ROUNDS / request_s) * TIMED_ROUNDS
    assert done == max(options.min_timed_runs, min(options.max_timed_runs, fits)) or (
        options.min_timed_runs <= done <= options.max_timed_runs and abs(done - fits) < TIMED_ROUNDS)


def test_tokens_per_request_default_by_device():
    from dataclasses import replace

    from quasar.evaluate.harness import (
        DEFAULT_TOKENS_PER_REQUEST,
        EvaluationOptions,
        tokens_per_request,
    )

    assert tokens_per_request(EvaluationOptions(device="cuda")) == DEFAULT_TOKENS_PER_REQUEST
    assert tokens_per_request(EvaluationOptions(device="cuda:3")) == DEFAULT_TOKENS_PER_REQUEST
    assert tokens_per_request(EvaluationOptions(device="cpu")) == 0
    assert tokens_per_request(replace(EvaluationOptions(device="cpu"), tokens_per_request=4096)) == 4096


def test_bad_tokens_per_request_is_refused(tmp_path):
    from quasar.evaluate.harness import (
        EvaluationInputError,
        EvaluationOptions,
        evaluate,
    )

    for bad in (-1, 1 << 30, 1.5):
        with pytest.raises(EvaluationInputError, match="tokens_per_request"):
            evaluate(tmp_path, 64, None, EvaluationOptions(device="cpu", tokens_per_request=bad))


def test_verification_checks_every_forward_of_the_requests_it_picks(monkeypatch):
    from quasar.evaluate import harness

    # Batches of two forwards at 64 tokens and of one above: a request of three is checked in pieces.
    monkeypatch.setattr(harness, "REFERENCE_BATCH_TOKENS", 128)
    reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
    reference.load_state_dict(workload.make_weights(9), strict=True)
    runs = {64: honest_run(reference, 64, timed=2, count=3), 128: honest_run(reference, 128, timed=2, count=3,
                                                                              fake_after_first=True)}
    # A reply whose middle fingerprint is replaced by NaNs: that forward fails, and so does the
    # next, whose input the parent rebuilds from the NaNs' bits, not from what the child used.
    runs[96] = honest_run(reference, 96, timed=1, count=3)
    assert runs[96].timed[-1] is not runs[96].check
    runs[96].timed[-1].fingerprints[1] = math.nan
    reasons = harness._verify(runs, harness.ReferenceWork(9, "cpu", [], {}), Timings(), lambda event: None, 128)
    honest, faked = runs[64].result, runs[128].result
    # Two timed requests and the correctness request, every forward of each.
    assert honest.correct is True and honest.runs_verified == 9 and honest.requests_verified == 3
    assert faked.correct is False and faked.runs_verified == 9
    assert runs[96].result.correct is False and runs[96].result.runs_verified == 6
    # The reasons come shortest length first, whatever the order of the runs.
    assert reasons[0] == (f"T=96: 2 of 6 timed forwards checked do not match the reference (largest error inf > "
                          f"{harness.FINGERPRINT_TOLERANCE:g}): the output was not computed from that run's input")
    assert len([reason for reason in reasons if reason.startswith("T=96")]) == 1
    assert (f"T=128: 6 of 9 timed forwards checked do not match the reference (largest error "
            f"{faked.fingerprint_error:.3g} > {harness.FINGERPRINT_TOLERANCE:g}): the output was not "
            "computed from that run's input") in reasons
    # Its correctness request skipped the same forwards: its last output is zeros.
    assert "T=128: the output differs from the reference: relative error 1 > 0.02 over the whole sequence" in reasons


def _timed_run(length: int, count: int, timed: int):
    from quasar.evaluate.harness import LengthResult, _LengthRun, _Request

    run = _LengthRun(LengthResult(seq_len=length, forwards_per_request=count))
    run.timed = [_Request(index, index, torch.zeros(count, 8, workload.FINGERPRINT_DIRECTIONS), 1) for index in range(timed)]
    run.check = run.timed[timed // 3]
    return run


def test_requests_to_verify_cover_max_verified_forwards_at_short_lengths_and_the_bound_at_the_target():
    from quasar.evaluate.harness import (
        ESCAPE_BOUND,
        MAX_VERIFIED,
        VERIFY_SAMPLE,
        degraded_to_move_median,
        escape_probability,
        requests_to_verify,
    )

    assert requests_to_verify(_timed_run(512, 1, 200), target=False) == MAX_VERIFIED
    assert requests_to_verify(_timed_run(512, 4, 200), target=False) == MAX_VERIFIED // 4
    assert requests_to_verify(_timed_run(512, 25, 200), target=False) == VERIFY_SAMPLE
    assert requests_to_verify(_timed_run(100_000, 1, 200), target=False) == VERIFY_SAMPLE
    assert requests_to_verify(_timed_run(100_000, 8, 200), target=False) == VERIFY_SAMPLE
    # Never more than were timed.
    assert requests_to_verify(_timed_run(512, 1, 5), target=False) == 5
    for timed in (3, 10, 11, 20, 57, 100, 150, 200):
        run = _timed_run(1_000_000, 1, timed)
        wanted = requests_to_verify(run, target=True)
        degraded = degraded_to_move_median(timed)
        # The least that meets the bound (or every request when none fewer does).
        assert escape_probability(timed, wanted, degraded) <= ESCAPE_BOUND or wanted == timed
        assert wanted == min(VERIFY_SAMPLE, timed) or escape_probability(timed, wanted - 1, degraded) > ESCAPE_BOUND
    assert requests_to_verify(_timed_run(1_000_000, 1, 150), target=True) == 10


@pytest.mark.parametrize("trial", range(3))
def test_escape_probability_is_the_chance_of_drawing_no_degraded_request(trial):
    # The formula against every subset (small sizes), and against the harness's own draw.
    from quasar.evaluate.harness import _checked_requests, escape_probability

    rng = random.Random()
    timed, verified = rng.randint(4, 9), rng.randint(1, 4)
    degraded = rng.randint(0, timed - 1)
    subsets = list(itertools.combinations(range(timed), verified))
    missed = sum(all(index >= degraded for index in subset) for subset in subsets)
    assert escape_probability(timed, verified, degraded) == pytest.approx(missed / len(subsets))

    # The check's place is drawn before the requests run; the others after. Degrade a random
    # half plus one: the draw misses all of them about as often as the formula says.
    run = _timed_run(1_000_000, 1, 40)
    bad = set(rng.sample(range(40), 21))
    draws = 4000
    escaped = 0
    for _ in range(draws):
        run.check = run.timed[rng.randrange(40)]
        chosen = _checked_requests(run, target=False)
        assert len(chosen) == len(set(map(id, chosen))) == 4 and chosen[0] is run.check
        escaped += not any(request.input_seed in bad for request in chosen)
    expected = escape_probability(40, 4, 21)
    assert abs(escaped / draws - expected) < 4 * math.sqrt(expected * (1 - expected) / draws) + 1e-3


@pytest.mark.parametrize("trial", range(2))
def test_the_draw_takes_checks_computed_ahead_and_stays_uniform(trial):
    # Places computed ahead: a uniformly random set of the pool; the timed requests took the first
    # places. Over many evaluations, each timed request is checked equally often, and the draw
    # takes requests computed ahead first.
    from quasar.evaluate.harness import _checked_requests, requests_to_verify

    rng = random.Random()
    pool, timed = 200, rng.randint(40, 150)
    inclusion = [0] * timed
    draws, ahead_used = 3000, 0
    for _ in range(draws):
        run = _timed_run(1_000_000, 1, timed + 1)
        run.check = run.timed.pop(rng.randrange(len(run.timed) + 0) if run.timed else 0)
        for position, request in enumerate(run.timed):
            request.position = position
        run.timed.insert(rng.randrange(len(run.timed) + 1), run.check)
        run.precomputed = {place: None for place in rng.sample(range(pool), 24)}
        chosen = _checked_requests(run, target=True)
        wanted = requests_to_verify(run, True)
        assert len(chosen) == wanted and chosen[0] is run.check
        timed_ahead = [request for request in run.timed if request.position in run.precomputed]
        ahead_used += sum(request.position in run.precomputed for request in chosen[1:])
        assert sum(request.position in run.precomputed for request in chosen[1:]) == min(len(timed_ahead), wanted - 1)
        for request in chosen[1:]:
            inclusion[request.position] += 1
    expected = draws * (requests_to_verify(_timed_run(1_000_000, 1, timed + 1), True) - 1) / timed
    # Each request's count is binomial around the same mean: none far from it.
    assert max(abs(count - expected) for count in inclusion) < 5 * math.sqrt(expected) + 2
    assert ahead_used > 0


def test_checks_computed_ahead_are_those_of_the_requests_the_child_makes():
    # ReferenceWork computes, while the child warms up, the expected fingerprints of timed requests
    # at random places of the seed pool; a request made on those seeds checks against them as it
    # would against a reference computed afterwards.
    from quasar.evaluate import harness

    references = harness.ReferenceWork(11, "cpu", [64], {64: 1}, pool_size=30, ahead=True)
    references.complete()
    reference = references.wait()
    ahead = references.precomputed[64]
    assert len(ahead) == min(harness.AHEAD_REQUESTS, 30) and set(ahead) <= set(range(30))
    for place, (fingerprints, norms) in ahead.items():
        buffers = filled(1, 64, *references.timed_seeds[64][place])
        with torch.inference_mode():
            output = reference(buffers.noise[0:1])[0]
        assert torch.allclose(fingerprints, workload.fingerprint(output, buffers.directions[0], buffers.token_weights[0]),
                              rtol=1e-4, atol=1e-4)
        assert torch.allclose(norms, workload.segment_norms(output), rtol=1e-5)
    # An honest run whose timed requests took the pool's seeds passes; one whose requests were
    # answered on other inputs fails, checked from the values computed ahead alone.
    for honest in (True, False):
        run = honest_run(reference, 64, timed=12)
        regular = [request for request in run.timed if request is not run.check]
        for position, request in enumerate(regular):
            seeds = references.timed_seeds[64][position]
            used = seeds if honest else (seeds[0] + 1, seeds[1])
            payload, _ = child_request(reference, 64, used, 1)
            request.input_seed, request.basis_seed = seeds
            request.fingerprints, request.position = harness._fingerprints(payload, 1, "test"), position
        run.precomputed = ahead
        real = harness._reference_outputs
        computed = []

        def counting(reference, buffers, request, start, stop):
            computed.append(request)
            return real(reference, buffers, request, start, stop)

        harness._reference_outputs = counting
        try:
            reasons = harness._verify_length(run, reference, "cpu", lambda event: None, target=True)
        finally:
            harness._reference_outputs = real
        assert (reasons == []) is honest, reasons
        # Only the correctness request (and drawn requests not computed ahead) needed a reference now.
        drawn_not_ahead = [r for r in computed if r is not run.check]
        assert all(request.position not in ahead for request in drawn_not_ahead)


def test_recommended_claim_is_the_speed_three_in_four_requests_reached():
    rng = random.Random()
    durations = [rng.randint(1_000_000, 5_000_000) for _ in range(rng.randint(1, 200))]
    claim = harness.recommended_claim(4096, durations)
    reached = sum(4096 / (d / 1e9) >= claim for d in durations)
    assert reached >= 0.75 * len(durations)
    assert 4096 / (min(durations) / 1e9) >= claim >= 4096 / (max(durations) / 1e9)
    assert claim <= 4096 / (statistics.median(durations) / 1e9)


def load_bench_harness():
    """scripts/bench_harness.py as a module."""
    import importlib.util

    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "bench_harness.py")
    spec = importlib.util.spec_from_file_location("bench_harness", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_bench_harness_reports_the_spread_of_medians_and_of_bests():
    import io

    from rich.console import Console

    bench = load_bench_harness()

    def report(median: float, best: float) -> EvaluationReport:
        item = LengthResult(seq_len=512, status="ok", tokens_per_sec=median, tokens_per_sec_max=best,
                            tokens_per_sec_min=median / 2, cv=0.1, rel_error=0.01, forwards_per_request=64, subtracted_us=1.5)
        missing = LengthResult(seq_len=1024, status="oom")
        return EvaluationReport(verdict="pass", reasons=[], repo="r", target_seq_len=1024, seq_lens=[512, 1024],
                                device="cuda", device_name="gpu", import_check=None,
                                lengths={"512": item, "1024": missing})

    reports = [report(100.0, 200.0), report(104.0, 201.0), report(101.0, 202.0)]
    found = bench.agreement(reports)
    assert found["512"]["medians"] == [100.0, 104.0, 101.0] and found["512"]["bests"] == [200.0, 201.0, 202.0]
    assert found["512"]["spread"] == pytest.approx(0.04) and found["512"]["best_spread"] == pytest.approx(0.01)
    assert found["1024"] == {"medians": None, "statuses": ["oom"] * 3}
    console = Console(file=io.StringIO(), width=300)
    console.print(bench.agreement_table(reports, found))
    text = console.file.getvalue()
    assert "100 · 104 · 101" in text and "4.00%" in text and "200 · 201 · 202" in text and "1.00%" in text
    assert bench.parse_target("1M") == 1_000_000 and bench.parse_target("100000") == 100_000
    with pytest.raises(Exception, match="one length"):
        bench.parse_target("512,1024")

    # The steps: each event to the next, summed per stage and length, in the order they came.
    timeline = bench.Timeline()
    timeline.events = [(0.0, "start", None), (4.5, "calibrate", 512), (5.0, "warmup", 512), (5.5, "warmup", 512),
                       (9.0, "timed", 512), (10.0, "warmup", 512), (10.25, "done", None)]
    assert timeline.steps() == {"start": 4.5, "calibrate@512": 0.5, "warmup@512": 4.25, "timed@512": 1.0}
    console = Console(file=io.StringIO(), width=80)
    console.print(bench.steps_table([timeline.steps(), {"start": 3.5}]))
    text = console.file.getvalue()
    assert "warmup@512" in text and "4.00" in text and "3.50-4.50" in text
    assert bench.parse_tuning('{"num_stages": 1}') == {"num_stages": 1}
    with pytest.raises(Exception, match="unknown tunable 'stages'"):
        bench.parse_tuning('{"stages": 1}')


def test_bench_harness_evaluates_another_trees_files(tmp_path):
    from quasar.starter_fork import copy_starter_tree

    bench = load_bench_harness()

    tree = tmp_path / "older"
    starter = sorted(copy_starter_tree(tree))
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    copied = bench.copy_fork_tree(tree, tmp_path / "copy")
    assert copied == starter
    assert not (tmp_path / "copy" / ".git").exists()
    assert (tmp_path / "copy" / "fla" / "layers" / "quasar.py").read_bytes() == (tree / "fla" / "layers" / "quasar.py").read_bytes()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="not a fork's tree"):
        bench.copy_fork_tree(tmp_path / "empty", tmp_path / "copy2")


def test_the_sandbox_hides_site_folders_lent_by_a_pth_file_and_binds_no_checkout(tmp_path, monkeypatch):
    from quasar.evaluate.sandbox import site_folders

    lent = tmp_path / "image" / "lib" / "site-packages"
    checkout = tmp_path / "checkout"
    lent.mkdir(parents=True)
    checkout.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(lent), str(checkout)])
    # A folder of packages is hidden inside the sandbox wherever it lies in what is bound;
    # the child's Python is the installation, not this process's virtual environment.
    assert str(lent) in site_folders()
    assert str(checkout) not in site_folders()
    installation = _python_installation()
    assert all(not folder.startswith(str(checkout)) for folder in installation)
    if sys.prefix != sys.base_prefix:
        assert sys.prefix not in installation


def test_an_output_comes_back_the_same_through_the_shared_area_and_the_pipe(tmp_path, monkeypatch):
    from quasar.evaluate.sandbox import SandboxedChild
    from quasar.starter_fork import copy_starter_tree

    copy_starter_tree(tmp_path / "fork")
    rng = random.Random()
    length, weights_seed = 64, rng.randrange(1 << 30)
    seeds = {"input_seed": rng.randrange(1 << 63), "basis_seed": rng.randrange(1 << 63)}
    offsets, size = start.output_offsets([length, 128])
    area = protocol.SharedArea.create(size)
    received = {}
    try:
        # Through the pipe (no area), copied out of the area, and left in it to read once the child is gone.
        for way, shared, copy_up_to in (("pipe", None, 0), ("copied", area, 1 << 30), ("in place", area, 0)):
            monkeypatch.setattr(harness, "COPY_OUTPUTS_UP_TO", copy_up_to)
            with SandboxedChild(tmp_path / "fork", "cpu", SandboxPolicy(), shared=shared) as child:
                session = harness._Session(child, time.monotonic() + 120)
                session.request({"op": "load", "fork_dir": child.fork_dir, "weights_seed": weights_seed},
                                time.monotonic() + 120, "load")
                session.request({"op": "run", "seq_len": length, "count": 1, **seeds}, time.monotonic() + 60, "run",
                                max_payload=1 << 20)
                output = harness._receive_output(session, length, offsets[length], time.monotonic() + 60)
                assert isinstance(output, harness._SharedOutput) == (way == "in place"), way
                if way == "in place":
                    assert not child.gone.is_set()
            assert child.gone.is_set()
            received[way] = harness.output_tensor(output).clone()
            del output
    finally:
        area.close()
    assert received["pipe"].shape == (1, length, workload.HIDDEN_SIZE) and received["pipe"].abs().sum() > 0
    assert torch.equal(received["pipe"], received["copied"]) and torch.equal(received["pipe"], received["in place"])
    assert (offsets, size) == ({64: 0, 128: 64 * 512 * 4}, 192 * 512 * 4)


def test_a_fork_failing_the_import_check_has_its_started_child_killed_at_once(tmp_path, monkeypatch):
    # The child starts before the import check (its torch import overlaps the check); a fork that
    # fails the check never reaches the child's load, and the child, still starting, is killed
    # without the two seconds an exit request would wait for a reply.
    from quasar.evaluate import harness
    from quasar.evaluate.sandbox import SandboxedChild
    from quasar.starter_fork import copy_starter_tree

    fork = tmp_path / "fork"
    copy_starter_tree(fork)
    chunk = fork / "fla" / "ops" / "quasar" / "chunk.py"
    chunk.write_text("from fla.ops.gla import chunk_gla\n" + chunk.read_text())
    started, closed = [], []
    real_start, real_close = SandboxedChild.start, SandboxedChild.close

    def start(self):
        started.append(time.monotonic())
        return real_start(self)

    def close(self):
        began = time.monotonic()
        real_close(self)
        closed.append((began, time.monotonic(), self.process.poll() if self.process else None, self.workdir))

    monkeypatch.setattr(SandboxedChild, "start", start)
    monkeypatch.setattr(SandboxedChild, "close", close)
    checked = []
    real_check = harness._import_check
    monkeypatch.setattr(harness, "_import_check", lambda repo, options: checked.append(time.monotonic())
                        or real_check(repo, options))
    report = harness.evaluate(fork, 64, None, harness.EvaluationOptions(seq_lens=(), device="cpu"))
    assert report.verdict == "fail" and report.import_check.ok is False
    assert any(reason.startswith("import check: fla/ops/quasar/chunk.py:1: forbidden-import") for reason in report.reasons)
    assert len(started) == 1 and started[0] < checked[0]
    (began, ended, exit_status, workdir), = closed
    assert ended - began < 1.5 and exit_status is not None and workdir is None


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


@pytest.mark.parametrize("timed", [(3, 3), (10, 10), (10, 200), (4, 6)])
def test_the_correctness_request_runs_once_in_every_round_it_may_be_drawn_for(monkeypatch, timed):
    # Whatever round is drawn for it, and however the bounds on the timed requests fall in the
    # rounds, the correctness request runs exactly once, among the timed requests, and their
    # number stays within min_timed_runs and max_timed_runs.
    from quasar.evaluate.harness import TIMED_ROUNDS, EvaluationOptions, LengthResult, _LengthRun, _Request, _time_rounds

    made = []

    def run_request(session, length, count, deadline, what, seeds=None):
        made.append("timed")
        return _Request(1, 1, torch.zeros(count, 8, workload.FINGERPRINT_DIRECTIONS), 1_000_000)

    def correctness_request(session, run, count, deadline, timings, progress):
        made.append("check")
        run.check = _Request(*run.check_seeds, torch.zeros(count, 8, workload.FINGERPRINT_DIRECTIONS), 1_000_000)
        return run.check

    monkeypatch.setattr(harness, "_run_request", run_request)
    monkeypatch.setattr(harness, "_correctness_request", correctness_request)
    monkeypatch.setattr(harness, "_harness_cost", lambda *args: 1000)
    least, most = timed
    options = EvaluationOptions(device="cpu", min_timed_runs=least, max_timed_runs=most, timed_seconds=0.01)
    for check_round in range(TIMED_ROUNDS):
        for request_s in (1e-9, 10.0):  # a pace that fills every quota, and one that meets only the least
            made.clear()
            run = _LengthRun(LengthResult(seq_len=64, forwards_per_request=1), request_s=request_s, cost_ns=10**6,
                             check_seeds=(5, 6), check_round=check_round)
            assert _time_rounds(None, None, {64: run}, [64], {64: 1}, options, Timings(), lambda event: None) is None
            assert made.count("check") == 1, (check_round, request_s, made)
            assert least <= len(run.timed) <= most and run.check in run.timed, (check_round, request_s, made)
