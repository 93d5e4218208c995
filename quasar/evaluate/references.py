"""The parent's float32 reference work: the reference layer, the outputs of the correctness
requests and the expected fingerprints of timed requests drawn ahead, on a thread of their own
while the child warms up (docs/evaluation.md, "Timed forwards are as exact as the checked one").
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence

import torch

from quasar.evaluate import workload
from quasar.evaluate.options import (
    MAX_FORWARDS_PER_REQUEST,
    EvaluationOptions,
    check_lengths,
    draw_weights_seed,
    new_seed,
    request_counts,
)
from quasar.evaluate.session import Request

# Timed requests of one forward whose expected fingerprints the parent computes ahead, while the
# fork's kernels compile (ReferenceWork): twice the 10 a length of 100 to 200 timed requests needs,
# so that most of those drawn are among them.
AHEAD_REQUESTS = 24

# Forwards of a checked request whose reference runs as one batch make at most this many tokens.
REFERENCE_BATCH_TOKENS = 1 << 18


def request_buffers(request: Request, length: int, device: str) -> workload.RequestBuffers:
    """The noise and bases of ``request``, rebuilt from its seeds as the child made them."""
    buffers = workload.RequestBuffers.allocate(len(request.fingerprints), length, device)
    workload.fill_request(buffers, request.input_seed, request.basis_seed)
    return buffers


def reference_outputs(
    reference: torch.nn.Module, buffers: workload.RequestBuffers, request: Request, start: int, stop: int
) -> torch.Tensor:
    """The reference outputs ``[stop - start, T, 512]`` of forwards ``start`` to ``stop - 1`` of
    ``request``, in one batch, each on the input the child had to use: its noise times the signs of
    the fingerprint the child reported for the forward before (known for all of them at once, so
    a chain of forwards is checked as one batch)."""
    batch = workload.chained_inputs(buffers.noise, request.fingerprints, start, stop)
    with torch.inference_mode():
        return reference(batch)[0]


def reference_batch_size(seq_len: int) -> int:
    """Forwards of a request whose reference runs as one batch: :data:`REFERENCE_BATCH_TOKENS` tokens, at least one."""
    return max(1, REFERENCE_BATCH_TOKENS // seq_len)


class ReferenceWork:
    """The parent's reference layer and the expected outputs of the correctness requests, computed on a
    thread of their own while the sandboxed child warms up (the fork's kernels compile on the
    child's one core for seconds while the device has little to do). A validator's worker starts
    it while the fork is being cloned and hands it to :func:`evaluate` with the started child.

    The correctness requests' seeds are drawn here, before the child exists, and kept in this
    process until the request is asked for. Where a request is one forward (``counts``: forwards
    per request at each length, one from about 131k tokens on CUDA), that forward's input depends
    on the seeds alone and its output is computed here; a request of several forwards chains each
    input to the fingerprint the child reports for the forward before, so its last forward's
    output is computed with the timed requests' checks.

    At such a length the seeds of every timed request it may time (``pool_size``) are drawn here
    too (``timed_seeds``, used in order), and once the correctness outputs are done the thread
    computes the expected fingerprints of timed requests at places drawn at random in that pool
    (``precomputed``), up to :data:`AHEAD_REQUESTS`, until it is stopped (on CUDA only, unless
    ``ahead`` says otherwise: on a CPU it would share the cores with the child): at a million tokens the
    checks of the timed requests (a reference forward of about 0.3 s each on an H100) are then done
    while the fork's kernels compile, and :func:`checked_requests` draws from them.

    The thread builds the layer on the host at once and touches the device only once released
    (:meth:`release`, after the child's calibration); :meth:`wait` stops it after the reference it
    is computing and ends it, before the longest length's warm-up and the timed requests: the
    reference never shares the device with a measurement, nor its memory with the fork's largest
    forwards. A length whose expected output did not fit in memory is left to
    :func:`verify_length`, which reports it.
    """

    def __init__(
        self,
        weights_seed: int,
        device: str,
        lengths: Sequence[int],
        counts: dict[int, int],
        pool_size: int = 0,
        ahead: bool | None = None,
    ):
        self.weights_seed = weights_seed
        self.device = device
        self.counts = dict(counts)
        # On a CPU the child's warm-up and this work would share the cores: there they wait.
        self.ahead = device.startswith("cuda") if ahead is None else ahead
        self.check_seeds = {length: (new_seed(), new_seed()) for length in lengths}
        pooled = [length for length in lengths if self.counts[length] == 1]
        self.timed_seeds = {length: [(new_seed(), new_seed()) for _ in range(pool_size)] for length in pooled}
        self.precomputed: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {length: {} for length in pooled}
        self.expected: dict[int, torch.Tensor] = {}
        self.reference: torch.nn.Module | None = None
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._compute, name="quasar-reference", daemon=True)
        self._thread.start()

    def _compute(self) -> None:
        from quasar.reference import QuasarAttentionReference

        try:
            reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
            reference.load_state_dict(workload.make_weights(self.weights_seed), strict=True)
            self._released.wait()
            reference = reference.to(self.device).eval()
            self.reference = reference
            for length, seeds in self.check_seeds.items():
                if self.counts[length] != 1:
                    continue
                buffers = workload.RequestBuffers.allocate(1, length, self.device)
                workload.fill_request(buffers, *seeds)
                check = Request(*seeds, buffers.fingerprints, round_trip_ns=0)
                try:
                    self.expected[length] = reference_outputs(reference, buffers, check, 0, 1)
                except torch.OutOfMemoryError:
                    break
                finally:
                    del buffers
            if self.device.startswith("cuda"):
                self.rehearse(min(self.check_seeds))
            for length in sorted(self.timed_seeds, reverse=True) if self.ahead else ():
                self._compute_ahead(length)
        except BaseException as error:  # re-raised by wait(), in the evaluation's own thread
            self._error = error

    def _compute_ahead(self, length: int) -> None:
        """Expected fingerprints and norms of timed requests at ``length`` at places of its seed
        pool drawn at random, until :data:`AHEAD_REQUESTS` or a stop."""
        places = list(range(len(self.timed_seeds[length])))
        secrets.SystemRandom().shuffle(places)
        buffers = workload.RequestBuffers.allocate(1, length, self.device)
        try:
            for place in places[:AHEAD_REQUESTS]:
                if self._stop.is_set():
                    return
                seeds = self.timed_seeds[length][place]
                workload.fill_request(buffers, *seeds)
                request = Request(*seeds, buffers.fingerprints, round_trip_ns=0)
                expected = reference_outputs(self._loaded(), buffers, request, 0, 1)
                fingerprints = workload.fingerprints_of(expected, buffers.directions, buffers.token_weights)[0].cpu()
                self.precomputed[length][place] = (fingerprints, workload.segment_norms_of(expected)[0].cpu())
                del expected
        except torch.OutOfMemoryError:
            pass  # the rest is checked afterwards, where the verification reports what does not fit
        finally:
            del buffers

    def rehearse(self, length: int) -> None:
        """Check one made-up batch of timed forwards at ``length`` as :func:`verify_length` checks
        a request's (the batched reference, fingerprints and norms), and forget the result: in a
        fresh process (a validator's worker) their kernels load at first use, a quarter of a
        second on an H100 machine, which is then spent here while the child warms up."""
        count = min(reference_batch_size(length), MAX_FORWARDS_PER_REQUEST)
        try:
            buffers = workload.RequestBuffers.allocate(count, length, self.device)
            workload.fill_request(buffers, new_seed(), new_seed())
            request = Request(0, 0, torch.zeros(count, *workload.FINGERPRINT_SHAPE), 0)
            expected = reference_outputs(self._loaded(), buffers, request, 0, count)
            workload.fingerprints_of(expected, buffers.directions, buffers.token_weights).cpu()
            workload.segment_norms_of(expected).cpu()
        except torch.OutOfMemoryError:
            pass  # a rehearsal only: the verification meets the same limit and reports it

    def release(self) -> None:
        """Let the thread use the device from now on."""
        self._released.set()

    def complete(self) -> None:
        """Release the thread and wait until it has done all its work, the work ahead included."""
        self.release()
        self._thread.join()

    def join(self) -> None:
        """Stop the thread's work ahead, release it and wait for it to end (what it raised stays
        for :meth:`wait`)."""
        self._stop.set()
        self.release()
        self._thread.join()

    def _loaded(self) -> torch.nn.Module:
        """The reference layer, which the thread loads before computing anything else."""
        assert self.reference is not None
        return self.reference

    def wait(self) -> torch.nn.Module:
        """Release the thread and wait for it; the reference layer (raises what the thread raised)."""
        self.join()
        if self._error is not None:
            raise self._error
        return self._loaded()


def start_references(target_seq_len: int, options: EvaluationOptions) -> ReferenceWork:
    """The reference work of an evaluation of ``target_seq_len`` with ``options``, started now
    with the weights seed the evaluation will use (for :func:`evaluate`'s ``references``); raises
    :class:`EvaluationInputError` for lengths it would refuse."""
    lengths = check_lengths(options.seq_lens, target_seq_len, options.device, options.policy.memory_bytes)
    return ReferenceWork(
        draw_weights_seed(options), options.device, lengths, request_counts(lengths, options), options.max_timed_runs
    )
