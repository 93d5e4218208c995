"""The code that runs inside the sandbox: it serves the parent's requests over the harness's pipe.

Started as ``python -I -S child.py READ_FD WRITE_FD DEVICE SPIN_SECONDS SHARED_FD SITES`` from the
harness's own copy of this directory (``SHARED_FD``: the parent's protocol.SharedArea for outputs,
or -1; ``SITES``: a JSON list of the evaluation environment's site folders, the only packages on
its import path besides the standard library, this directory and, from ``load`` on, the fork).
Until the ``load`` request it runs only this file, ``protocol.py``, ``workload.py`` and torch, so
its answers to ``calibrate`` are trusted; from ``load`` on, the fork's code shares the process and
may patch anything, and the parent trusts nothing it says without checking.

Requests (JSON headers; see protocol.py) and replies:

- ``ping {triton_seed?}`` -> ``pong`` with ``cpus``, the CPUs this process may run on (sandbox
  start-up, before fork code), and ``seeded``, how many files of the Triton cache seed mounted at
  ``triton_seed`` it copied into its own cache (triton_seed.py; the first ping only)
- ``calibrate {seq_len, input_seed, basis_seed, count}``: a request as ``run`` makes it with a
  stand-in for the layer that returns a fixed output (on CUDA in a CUDA graph of its own), reply
  and payload included -> ``{ok}`` + fingerprints
- ``load {fork_dir, weights_seed}``: import the fork's ``fla.layers.quasar.QuasarAttention``,
  build the benchmark layer, load the weights -> ``{ok, parameters}``; an import of a module that
  neither the fork nor the evaluation environment has -> ``{ok: false, kind: "missing_module",
  module, error}``
- ``capture {seq_len, count, input_seed, basis_seed}``: on CUDA, capture the ``run`` of ``count``
  forwards at ``seq_len`` in one CUDA graph (after the eager forwards of a ``run`` there, so the
  fork's kernels are compiled and tuned), check that its replay agrees with the eager forwards,
  and replay it for every later ``run`` of that size -> ``{ok, timing}``: ``"cuda-graph"``, or
  ``"eager (capture failed: REASON)"`` and the forwards stay eager (always eager on CPU)
- ``run {seq_len, input_seed, basis_seed, count}``: fill the request's buffers from the seeds
  (workload.fill_request), run the ``count`` chained forwards (workload.run_forwards; the graph
  if captured) -> ``{ok}`` + the fingerprints as payload: float32 ``[count, 8, 2, 32]`` in this
  machine's byte order, read back in one synchronisation (JSON floats cost the host milliseconds)
- ``output {offset}``: the last forward's output as raw bytes -> ``{ok, dtype, shape}`` + payload,
  or, where the shared area holds it from ``offset`` on, ``{ok, dtype, shape, shared_bytes}`` with
  the bytes there
- ``memory {reset}``: peak device memory since the last reset and memory allocated now ->
  ``{ok, peak_bytes, allocated_bytes}``
- ``triton_cache`` -> ``{ok, files}`` + its Triton cache folder as an uncompressed tar (how the
  parent builds the seed from a run of the starter fork: triton_seed.py)
- ``exit``

A failure replies ``{ok: false, kind: "oom" | "error" | "needs_gpu", error}``; the process keeps
serving (after running out of memory without the slots of that length). ``needs_gpu``: on the CPU,
Triton found no GPU driver to run the fork's kernels (a real fla tree's modules launch Triton
kernels wherever their tensors are). From ``load`` on, the slots of every
length are kept for the rest of the evaluation: the parent times the lengths in rounds.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import io
import json
import mmap
import os
import shutil
import sys
import tarfile
import traceback
from collections.abc import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    sys.path.extend(json.loads(sys.argv[6]))
    # Imports of thousands of modules run 15-25% faster without the cyclic collector (on one core).
    gc.disable()

# torch comes from the environment's site folders now, before the fork's directory is on the
# path, so a fork cannot shadow it (or anything else imported here).
import protocol
import torch
import workload

MAX_ERROR_CHARS = 4000
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def allowed_cpus() -> list[int] | None:
    """The CPUs this process may run on (None where the OS does not say)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


# A device-to-host copy at least this large goes by DMA into the destination, registered with CUDA
# for the copy (page-locked): a copy into pageable memory is staged through the driver's own
# buffers by this process's one pinned core, about 1 s for a 1 GiB output on an H100 machine.
DMA_COPY_FROM_BYTES = 64 << 20
PAGE_BYTES = mmap.PAGESIZE


def loaded_cuda_runtime() -> ctypes.CDLL | None:
    """The CUDA runtime library torch loaded into this process, or None (a torch that links it
    statically). A failed call leaves its error for the thread's next ``cudaGetLastError``, which
    torch's next kernel launch check would raise: only through the same library can it be cleared."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        return None
    found = sorted(path for path in paths if os.path.basename(path).startswith("libcudart.so"))
    return ctypes.CDLL(found[0]) if found else None


@contextlib.contextmanager
def registered_for_dma(destination: torch.Tensor, source_device: torch.device) -> Iterator[None]:
    """Page-lock the pages of the host tensor ``destination`` with CUDA while the block copies into
    it from ``source_device`` (when CUDA and :data:`DMA_COPY_FROM_BYTES` or more); where the
    runtime is not at hand or the registration fails (its error cleared) the copy goes on as a
    pageable one."""
    nbytes = destination.numel() * destination.element_size()
    runtime = loaded_cuda_runtime() if source_device.type == "cuda" and nbytes >= DMA_COPY_FROM_BYTES else None
    if runtime is None:
        yield
        return
    start = ctypes.c_void_p(destination.data_ptr() // PAGE_BYTES * PAGE_BYTES)
    size = -(-(destination.data_ptr() + nbytes - (start.value or 0)) // PAGE_BYTES) * PAGE_BYTES
    if runtime.cudaHostRegister(start, ctypes.c_size_t(size), ctypes.c_uint(0)) != 0:
        runtime.cudaGetLastError()
        yield
        return
    try:
        yield
    finally:
        if runtime.cudaHostUnregister(start) != 0:
            runtime.cudaGetLastError()


class LayerOutputError(Exception):
    """The layer returned something other than an output of shape ``[1, T, 512]``."""


class CaptureFailed(Exception):
    """A request could not be captured in a CUDA graph, or its replay disagrees with the eager forwards."""


# The first forward's fingerprint from a graph's replay and from the eager forwards on the same
# input: deterministic kernels agree exactly; this leaves room for atomics' rounding.
GRAPH_AGREEMENT_TOLERANCE = 1e-3
MAX_REASON_CHARS = 300
LAYER, STAND_IN = "layer", "stand-in"


def triton_cache_dir() -> str:
    """The folder Triton caches its compilations in (the parent sets TRITON_CACHE_DIR in the sandbox)."""
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")


def copy_triton_seed(seed: str | None) -> int:
    """Copy the seed the parent mounted at ``seed`` into this process's own, writable Triton cache,
    before any fork code runs; returns the number of files copied (0 without a seed). The seed holds
    what Triton compiled for the starter fork's kernels, so a fork whose kernels are the same loads
    them instead of compiling them again; Triton's own cache keys decide what is reused."""
    if not isinstance(seed, str) or not os.path.isdir(seed):
        return 0
    cache = triton_cache_dir()
    try:
        shutil.copytree(seed, cache, symlinks=False, dirs_exist_ok=True)
    except OSError:
        # A half-copied seed could hold a truncated file: compile everything instead.
        shutil.rmtree(cache, ignore_errors=True)
        return 0
    return sum(len(names) for _, _, names in os.walk(seed))


def triton_cache_archive() -> tuple[bytes, int]:
    """This process's Triton cache folder as an uncompressed tar of its regular files, and their count."""
    cache = triton_cache_dir()
    buffer = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for directory, subdirectories, names in os.walk(cache):
            subdirectories.sort()
            for name in sorted(names):
                path = os.path.join(directory, name)
                if os.path.isfile(path) and not os.path.islink(path):
                    archive.add(path, arcname=os.path.relpath(path, cache), recursive=False)
                    count += 1
    return buffer.getvalue(), count


def failure_reason(error: BaseException) -> str:
    """The first line of the error that started a chain of exceptions (a failed capture raises
    again when it ends; the first error says why)."""
    while error.__context__ is not None:
        error = error.__context__
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    return text[:MAX_REASON_CHARS]


class Slot:
    """The state kept for requests of one ``(seq_len, count)``: buffers, captured graphs, the stand-in output."""

    def __init__(self, buffers: workload.RequestBuffers):
        self.buffers = buffers
        self.graphs: dict[str, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.stand_in: torch.Tensor | None = None


class Server:
    """State of the child between requests: the device, the layer, the request slots, the last output."""

    def __init__(self, channel: protocol.Channel, device: str, shared: protocol.SharedArea | None = None):
        self.channel = channel
        self.shared = shared
        self.seeded: int | None = None
        self.device = torch.device(device)
        self.layer: torch.nn.Module | None = None
        self.last_output: torch.Tensor | None = None
        self.slots: dict[tuple[int, int], Slot] = {}

    def slot(self, seq_len: int, count: int) -> Slot:
        """The slot of ``(seq_len, count)``, kept for the rest of the evaluation (the parent times
        every length in rounds)."""
        key = (seq_len, count)
        if key not in self.slots:
            self.slots[key] = Slot(workload.RequestBuffers.allocate(count, seq_len, self.device))
        return self.slots[key]

    def drop_slots(self, seq_len: int) -> None:
        """Forget the slots of ``seq_len`` (after it ran out of memory), so other lengths get the memory back."""
        for key in [key for key in self.slots if key[0] == seq_len]:
            del self.slots[key]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def request_slot(self, request: dict) -> Slot:
        """The slot of a request's ``seq_len`` and ``count`` (at least 1)."""
        return self.slot(int(request["seq_len"]), max(int(request.get("count", 1)), 1))

    def layer_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The fork's layer on one input under bf16 autocast, its output checked for shape.

        The autocast cache is off: a CUDA graph must not keep casts made outside it (and the
        cast weights are the same either way).
        """
        assert self.layer is not None, "a forward before the layer was loaded"
        with torch.autocast(self.device.type, dtype=workload.AUTOCAST_DTYPE, cache_enabled=False):
            result = self.layer(hidden)
        output = result[0] if isinstance(result, (tuple, list)) else result
        del result
        seq_len = hidden.shape[1]
        if not isinstance(output, torch.Tensor) or tuple(output.shape) != (1, seq_len, workload.HIDDEN_SIZE):
            shape = list(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
            raise LayerOutputError(f"layer output has shape {shape}, expected [1, {seq_len}, 512]")
        return output

    def stand_in_forward(self, slot: Slot):
        """A stand-in for the layer that returns one fixed output (the harness's own cost, calibrated)."""
        if slot.stand_in is None:
            slot.stand_in = torch.full(
                (1, slot.buffers.seq_len, workload.HIDDEN_SIZE), 0.5, device=self.device, dtype=workload.AUTOCAST_DTYPE
            )
        stand_in = slot.stand_in
        return lambda hidden: stand_in

    def execute(self, slot: Slot, request: dict, which: str, forward) -> tuple[memoryview, torch.Tensor]:
        """Fill the buffers of a request (of ``slot``'s size) from its seeds and run its forwards
        (the captured graph of ``which`` if there is one); the fingerprints as raw float32 bytes,
        read back in the request's one synchronisation, and the last output."""
        workload.fill_request(slot.buffers, int(request["input_seed"]), int(request["basis_seed"]))
        if which in slot.graphs:
            graph, output = slot.graphs[which]
            graph.replay()
        else:
            output = workload.run_forwards(forward, slot.buffers)
        return memoryview(slot.buffers.fingerprints.cpu().numpy()).cast("B"), output

    def capture(self, slot: Slot, which: str, forward, input_seed: int, basis_seed: int) -> None:
        """Capture the forwards of a request of ``slot``'s size in one CUDA graph, kept as ``which``.

        As torch.cuda.graph does: an eager forward on a side stream first (cuBLAS and the
        allocator set up there; the request's first forward alone: every forward of a request runs
        the same kernels, and the eager first forward is all the check below compares), then the
        capture on it, from a private memory pool. The graph is replayed on the eager forward's
        input and must agree with it. Raises CaptureFailed with the reason; the private pool is
        then released.
        """
        buffers = slot.buffers
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        pool_open = False
        try:
            with torch.cuda.stream(side):
                workload.fill_request(buffers, input_seed, basis_seed)
                workload.run_forwards(forward, buffers, count=1)
                eager_first = buffers.fingerprints[0].clone()
                torch.cuda.empty_cache()
                pool_open = True
                graph.capture_begin(pool=pool)
                try:
                    output = workload.run_forwards(forward, buffers)
                finally:
                    graph.capture_end()
                    pool_open = False
            current.wait_stream(side)
            workload.fill_request(buffers, input_seed, basis_seed)
            graph.replay()
            replayed = buffers.fingerprints[0]
            scale = float(torch.linalg.vector_norm(eager_first))
            difference = float(torch.linalg.vector_norm(replayed - eager_first)) / max(scale, 1e-30)
        except Exception as error:  # any failure of the capture, fork code included, is a reason
            if pool_open:
                recover_from_failed_capture(self.device, pool)
            raise CaptureFailed(failure_reason(error)) from None
        if not difference <= GRAPH_AGREEMENT_TOLERANCE:
            raise CaptureFailed(
                f"the graph's replay differs from the eager forwards (relative difference "
                f"{difference:.3g} of the first forward's fingerprint)"
            )
        slot.graphs[which] = (graph, output)

    def handle_calibrate(self, request: dict) -> tuple[dict, memoryview | None]:
        slot = self.request_slot(request)
        forward = self.stand_in_forward(slot)
        with torch.inference_mode():
            if self.device.type == "cuda" and STAND_IN not in slot.graphs:
                try:
                    self.capture(slot, STAND_IN, forward, int(request["input_seed"]), int(request["basis_seed"]))
                except CaptureFailed as failure:
                    return {"ok": False, "kind": "error", "error": f"the harness's own CUDA graph: {failure}"}, None
            fingerprints, _ = self.execute(slot, request, STAND_IN, forward)
        return {"ok": True}, fingerprints

    def handle_load(self, request: dict) -> tuple[dict, None]:
        self.slots.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        sys.path.insert(0, request["fork_dir"])
        gc.disable()
        try:
            from fla.layers.quasar import QuasarAttention
        except ModuleNotFoundError as error:
            reply = {
                "ok": False,
                "kind": "missing_module",
                "module": error.name or "",
                "error": traceback.format_exc()[-MAX_ERROR_CHARS:],
            }
            return reply, None
        finally:
            settle_garbage_collector()

        layer = QuasarAttention(**workload.LAYER_KWARGS)
        layer.load_state_dict(workload.make_weights(int(request["weights_seed"])), strict=True)
        self.layer = layer.to(self.device).eval()
        parameters = sum(p.numel() for p in layer.parameters())
        return {"ok": True, "parameters": parameters}, None

    def handle_capture(self, request: dict) -> tuple[dict, None]:
        if self.layer is None:
            return {"ok": False, "kind": "error", "error": "capture before load"}, None
        if self.device.type != "cuda":
            return {"ok": True, "timing": "eager (cpu)"}, None
        slot = self.request_slot(request)
        self.last_output = None
        slot.graphs.pop(LAYER, None)
        with torch.inference_mode():
            try:
                self.capture(slot, LAYER, self.layer_forward, int(request["input_seed"]), int(request["basis_seed"]))
            except CaptureFailed as failure:
                torch.cuda.empty_cache()
                return {"ok": True, "timing": f"eager (capture failed: {failure})"}, None
        return {"ok": True, "timing": "cuda-graph"}, None

    def handle_run(self, request: dict) -> tuple[dict, memoryview | None]:
        if self.layer is None:
            return {"ok": False, "kind": "error", "error": "run before load"}, None
        self.last_output = None
        with torch.inference_mode():
            try:
                fingerprints, output = self.execute(self.request_slot(request), request, LAYER, self.layer_forward)
            except LayerOutputError as error:
                return {"ok": False, "kind": "error", "error": str(error)}, None
        self.last_output = output
        return {"ok": True}, fingerprints

    def send_output(self, request: dict) -> None:
        output = self.last_output
        if output is None:
            self.channel.send({"ok": False, "kind": "error", "error": "no output to send"})
            return
        if output.dtype not in _DTYPE_NAMES:
            output = output.float()
        header = {"ok": True, "dtype": _DTYPE_NAMES[output.dtype], "shape": list(output.shape)}
        raw = output.detach().contiguous().reshape(-1).view(torch.uint8)
        offset = request.get("offset", 0)
        if (
            self.shared is not None
            and isinstance(offset, int)
            and 0 <= offset
            and offset + raw.numel() <= self.shared.size
        ):
            # Straight from the device into the parent's area: no host copy, no pipe.
            destination = torch.frombuffer(self.shared.mapping(), dtype=torch.uint8, count=raw.numel(), offset=offset)
            with registered_for_dma(destination, raw.device):
                destination.copy_(raw)
            self.channel.send({**header, "shared_bytes": raw.numel()})
            return
        self.channel.send(header, memoryview(raw.cpu().numpy().data).cast("B"))

    def handle_memory(self, request: dict) -> tuple[dict, None]:
        if self.device.type != "cuda":
            return {"ok": True, "peak_bytes": None, "allocated_bytes": None}, None
        peak = torch.cuda.max_memory_allocated(self.device)
        if request.get("reset"):
            torch.cuda.reset_peak_memory_stats(self.device)
        return {
            "ok": True,
            "peak_bytes": int(peak),
            "allocated_bytes": int(torch.cuda.memory_allocated(self.device)),
        }, None

    def serve(self) -> None:
        handlers = {
            "calibrate": self.handle_calibrate,
            "load": self.handle_load,
            "capture": self.handle_capture,
            "run": self.handle_run,
            "memory": self.handle_memory,
            "triton_cache": self.handle_triton_cache,
        }
        while True:
            request, _ = self.channel.recv()
            op = request.get("op")
            if op == "exit":
                return
            if op == "ping":
                if self.seeded is None:
                    self.seeded = copy_triton_seed(request.get("triton_seed"))
                self.channel.send({"ok": True, "op": "pong", "cpus": allowed_cpus(), "seeded": self.seeded})
                continue
            if op == "output":
                self.send_output(request)
                continue
            payload = None
            try:
                reply, payload = handlers[op](request)
            except torch.OutOfMemoryError as error:
                self.last_output = None
                reply = {
                    "ok": False,
                    "kind": "oom",
                    "error": str(error)[:MAX_ERROR_CHARS],
                    "peak_bytes": self.peak_bytes(),
                }
                if "seq_len" in request:
                    self.drop_slots(int(request["seq_len"]))
            except BaseException as error:  # any failure of fork code is reported, not fatal
                self.last_output = None
                kind = "needs_gpu" if self.device.type == "cpu" and triton_found_no_driver(error) else "error"
                reply = {"ok": False, "kind": kind, "error": traceback.format_exc()[-MAX_ERROR_CHARS:]}
            self.channel.send(reply, payload)

    def handle_triton_cache(self, request: dict) -> tuple[dict, bytes]:
        archive, count = triton_cache_archive()
        return {"ok": True, "files": count}, archive

    def peak_bytes(self) -> int | None:
        if self.device.type != "cuda":
            return None
        return int(torch.cuda.max_memory_allocated(self.device))


def triton_found_no_driver(error: BaseException) -> bool:
    """Whether ``error`` (or an error it arose from) is Triton finding no GPU driver to launch a
    kernel with ("0 active drivers ([]). There should only be one.")."""
    visited: set[int] = set()
    seen: BaseException | None = error
    while seen is not None and id(seen) not in visited:
        if isinstance(seen, RuntimeError) and "active drivers" in str(seen):
            return True
        visited.add(id(seen))
        seen = seen.__cause__ or seen.__context__
    return False


def recover_from_failed_capture(device: torch.device, pool: tuple[int, int]) -> None:
    """Undo what a capture that failed before it ended leaves behind in torch (which does not):
    the caching allocator still routing to the capture's memory pool and holding its blocks, and
    the default CUDA generator still marked as capturing, so that any later use of it fails
    ("Offset increment outside graph capture"). Best effort: these are torch's private hooks
    and a newer Generator method, which another version may lack or not need."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    for hook in ("_cuda_endAllocateToPool", "_cuda_releasePool"):
        try:
            getattr(torch._C, hook)(index, pool)
        except (AttributeError, RuntimeError):
            pass
    generator = torch.cuda.default_generators[index]
    try:
        # A clone of the state keeps the seed and offset and is not marked as capturing.
        generator.graphsafe_set_state(generator.clone_state())
    except (AttributeError, RuntimeError):
        pass


def settle_garbage_collector() -> None:
    """After a burst of imports: what they made moves to the collector's permanent generation (its
    later collections, which could land in a timed request, do not walk it again), and the
    collector is on again."""
    gc.freeze()
    gc.enable()


def main() -> None:
    read_fd, write_fd, device, spin_seconds = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    shared_fd = int(sys.argv[5])
    channel = protocol.Channel(read_fd, write_fd, spin_seconds=spin_seconds)
    shared = protocol.SharedArea(shared_fd, os.fstat(shared_fd).st_size) if shared_fd >= 0 else None
    settle_garbage_collector()
    Server(channel, device, shared).serve()


if __name__ == "__main__":
    main()
