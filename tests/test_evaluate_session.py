"""The parent's side of the conversation with the child (quasar/evaluate/session.py)."""

from __future__ import annotations

import random
import time

import pytest
import torch

from quasar.evaluate import protocol, session, start, workload
from quasar.evaluate.sandbox import SandboxedChild, SandboxPolicy
from quasar.evaluate.session import (
    ChildFailure,
    Session,
    SharedOutput,
    output_tensor,
    parse_fingerprints,
    receive_output,
    reply_failure,
)
from quasar.starter_fork import copy_starter_tree


def test_the_parent_takes_one_fingerprint_per_forward_from_the_reply():
    values = torch.randn(4, *workload.FINGERPRINT_SHAPE)
    payload = bytearray(memoryview(values.numpy()).cast("B"))
    assert torch.equal(parse_fingerprints(payload, 4, "test"), values)
    with pytest.raises(
        ChildFailure,
        match=f"1536 bytes of fingerprints for 4 forwards, expected {4 * 8 * 2 * 4 * workload.FINGERPRINT_DIRECTIONS}",
    ):
        parse_fingerprints(payload[:1536], 4, "test")
    with pytest.raises(ChildFailure, match="0 bytes of fingerprints for 1 forwards"):
        parse_fingerprints(None, 1, "test")


def test_an_output_comes_back_the_same_through_the_shared_area_and_the_pipe(tmp_path, monkeypatch):
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
            monkeypatch.setattr(session, "COPY_OUTPUTS_UP_TO", copy_up_to)
            with SandboxedChild(tmp_path / "fork", "cpu", SandboxPolicy(), shared=shared) as child:
                conversation = Session(child, time.monotonic() + 120)
                conversation.request(
                    {"op": "load", "fork_dir": child.fork_dir, "weights_seed": weights_seed},
                    time.monotonic() + 120,
                    "load",
                )
                conversation.request(
                    {"op": "run", "seq_len": length, "count": 1, **seeds},
                    time.monotonic() + 60,
                    "run",
                    max_payload=1 << 20,
                )
                output = receive_output(conversation, length, offsets[length], time.monotonic() + 60)
                assert isinstance(output, SharedOutput) == (way == "in place"), way
                if way == "in place":
                    assert not child.gone.is_set()
            assert child.gone.is_set()
            received[way] = output_tensor(output).clone()
            del output
    finally:
        area.close()
    assert received["pipe"].shape == (1, length, workload.HIDDEN_SIZE) and received["pipe"].abs().sum() > 0
    assert torch.equal(received["pipe"], received["copied"]) and torch.equal(received["pipe"], received["in place"])
    assert (offsets, size) == ({64: 0, 128: 64 * 512 * 4}, 192 * 512 * 4)


def test_a_cuda_error_is_named_by_its_error_line_not_by_torchs_debugging_hints():
    """torch's CUDA errors end with hints for the one debugging them: the reason quoted only the
    last, 'Compile with `TORCH_USE_CUDA_DSA` ...', telling the miner nothing of what the kernel did
    (a fork writing out of bounds on an H100, tests/test_evaluate_fairness_gpu.py)."""
    message = (
        "CUDA error: an illegal memory access was encountered\n"
        "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
        "group__CUDART__TYPES.html for more information.\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
    )
    failure = reply_failure({"ok": False, "error": message}, 4096, "warm-up at T=4096")
    assert failure.message == "warm-up at T=4096 failed: CUDA error: an illegal memory access was encountered"
    plain = reply_failure({"ok": False, "error": "Traceback ...\nValueError: bad shape"}, 4096, "warm-up at T=4096")
    assert plain.message == "warm-up at T=4096 failed: ValueError: bad shape"
