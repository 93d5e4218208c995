"""The code that runs inside the sandbox: it serves the parent's requests over the harness's pipe.

Started as ``python -I child.py READ_FD WRITE_FD DEVICE SPIN_SECONDS`` from the harness's own copy of this
directory. Until the ``load`` request it runs only this file, ``protocol.py``, ``workload.py`` and
torch, so its answers to ``calibrate`` are trusted; from ``load`` on, the fork's code shares the
process and may patch anything, and the parent trusts nothing it says without checking.

Requests (JSON headers; see protocol.py) and replies:

- ``ping`` -> ``pong`` with ``cpus``, the CPUs this process may run on (sandbox start-up, before fork code)
- ``calibrate {seq_len, input_seed, basis_seed, count}``: everything a ``run`` does except the
  layer (inputs, bases, fingerprints of a stand-in output, the seed chain) -> ``{ok}``
- ``load {fork_dir, weights_seed}``: import the fork's ``fla.layers.quasar.QuasarAttention``,
  build the benchmark layer, load the weights -> ``{ok, parameters}``
- ``run {seq_len, input_seed, basis_seed, count}``: ``count`` forwards one after another, each
  on its own input (seeds from ``workload.chained_seeds``) -> ``{ok, fingerprints}`` (one per forward)
- ``output``: the last forward's output as raw bytes -> ``{ok, dtype, shape}`` + payload
- ``memory {reset}``: peak device memory since the last reset -> ``{ok, peak_bytes}``
- ``exit``

A failure replies ``{ok: false, kind: "oom" | "error", error}``; the process keeps serving.
"""

from __future__ import annotations

import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# torch comes from the environment's site-packages now, before the fork's directory is on the
# path, so a fork cannot shadow it (or anything else imported here).
import protocol
import torch
import workload

MAX_ERROR_CHARS = 4000
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def allowed_cpus() -> list[int] | None:
    """The CPUs this process may run on (None where the OS does not say)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


class LayerOutputError(Exception):
    """The layer returned something other than an output of shape ``[1, T, 512]``."""


class Server:
    """State of the child between requests: the device, the layer, the last output."""

    def __init__(self, channel: protocol.Channel, device: str):
        self.channel = channel
        self.device = torch.device(device)
        self.layer = None
        self.last_output: torch.Tensor | None = None
        self.stand_in: torch.Tensor | None = None

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def forwards(self, request: dict, layer) -> tuple[list, torch.Tensor]:
        """The ``count`` chained forwards of a request through ``layer``; their fingerprints and the last output.

        ``.tolist()`` waits for each forward (its fingerprint seeds the next input), so this is the
        only synchronisation a request needs.
        """
        seq_len, count = int(request["seq_len"]), int(request.get("count", 1))
        input_seed, basis_seed = int(request["input_seed"]), int(request["basis_seed"])
        fingerprints: list = []
        previous = output = None
        for index in range(max(count, 1)):
            output = None
            seeds = workload.chained_seeds(input_seed, basis_seed, index, previous)
            hidden = workload.make_input(seeds[0], seq_len, self.device)
            with torch.autocast(self.device.type, dtype=workload.AUTOCAST_DTYPE):
                result = layer(hidden)
            del hidden
            output = result[0] if isinstance(result, (tuple, list)) else result
            del result
            if not isinstance(output, torch.Tensor) or tuple(output.shape) != (1, seq_len, workload.HIDDEN_SIZE):
                shape = list(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
                raise LayerOutputError(f"layer output has shape {shape}, expected [1, {seq_len}, 512]")
            previous = workload.fingerprint(output, workload.make_basis(seeds[1], seq_len, self.device)).tolist()
            fingerprints.append(previous)
        return fingerprints, output

    def handle_calibrate(self, request: dict) -> dict:
        seq_len = int(request["seq_len"])
        if self.stand_in is None or self.stand_in.shape[1] != seq_len:
            self.stand_in = None
            self.stand_in = torch.randn(1, seq_len, workload.HIDDEN_SIZE, device=self.device, dtype=workload.AUTOCAST_DTYPE)
        stand_in = self.stand_in
        with torch.inference_mode():
            self.forwards(request, lambda hidden: stand_in)
        return {"ok": True}

    def handle_load(self, request: dict) -> dict:
        self.stand_in = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        sys.path.insert(0, request["fork_dir"])
        from fla.layers.quasar import QuasarAttention

        layer = QuasarAttention(**workload.LAYER_KWARGS)
        layer.load_state_dict(workload.make_weights(int(request["weights_seed"])), strict=True)
        self.layer = layer.to(self.device).eval()
        parameters = sum(p.numel() for p in self.layer.parameters())
        return {"ok": True, "parameters": parameters}

    def handle_run(self, request: dict) -> dict:
        if self.layer is None:
            return {"ok": False, "kind": "error", "error": "run before load"}
        self.last_output = None
        with torch.inference_mode():
            try:
                fingerprints, output = self.forwards(request, self.layer)
            except LayerOutputError as error:
                return {"ok": False, "kind": "error", "error": str(error)}
        self.last_output = output
        return {"ok": True, "fingerprints": fingerprints}

    def send_output(self) -> None:
        output = self.last_output
        if output is None:
            self.channel.send({"ok": False, "kind": "error", "error": "no output to send"})
            return
        if output.dtype not in _DTYPE_NAMES:
            output = output.float()
        host = output.detach().to("cpu").contiguous()
        raw = host.view(torch.uint8).numpy() if host.dtype == torch.bfloat16 else host.numpy()
        self.channel.send({"ok": True, "dtype": _DTYPE_NAMES[host.dtype], "shape": list(host.shape)}, memoryview(raw).cast("B"))

    def handle_memory(self, request: dict) -> dict:
        if self.device.type != "cuda":
            return {"ok": True, "peak_bytes": None}
        peak = torch.cuda.max_memory_allocated(self.device)
        if request.get("reset"):
            torch.cuda.reset_peak_memory_stats(self.device)
        return {"ok": True, "peak_bytes": int(peak)}

    def serve(self) -> None:
        handlers = {
            "calibrate": self.handle_calibrate,
            "load": self.handle_load,
            "run": self.handle_run,
            "memory": self.handle_memory,
        }
        while True:
            request, _ = self.channel.recv()
            op = request.get("op")
            if op == "exit":
                return
            if op == "ping":
                self.channel.send({"ok": True, "op": "pong", "cpus": allowed_cpus()})
                continue
            if op == "output":
                self.send_output()
                continue
            try:
                reply = handlers[op](request)
            except torch.OutOfMemoryError as error:
                self.last_output = None
                reply = {"ok": False, "kind": "oom", "error": str(error)[:MAX_ERROR_CHARS], "peak_bytes": self.peak_bytes()}
            except BaseException:  # noqa: BLE001  (any failure of fork code is reported, not fatal)
                self.last_output = None
                reply = {"ok": False, "kind": "error", "error": traceback.format_exc()[-MAX_ERROR_CHARS:]}
            self.channel.send(reply)

    def peak_bytes(self) -> int | None:
        if self.device.type != "cuda":
            return None
        return int(torch.cuda.max_memory_allocated(self.device))


def main() -> None:
    read_fd, write_fd, device, spin_seconds = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    channel = protocol.Channel(read_fd, write_fd, spin_seconds=spin_seconds)
    Server(channel, device).serve()


if __name__ == "__main__":
    main()
