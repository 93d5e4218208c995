"""The layer's input projection with the cast inside, in Gluon: ``out = bf16(x) @ W^T`` read from
``x`` in fp32, for Hopper.

Today's input side is two passes: a cast of ``x [T, C]`` from fp32 to bf16 (reads 4 bytes and
writes 2 a value) and cuBLAS's product of the bf16 copy (reads it again). This kernel reads the
fp32 values once: a load warp brings tiles of ``x`` (fp32) and ``W`` (bf16) into shared memory with
TMA, and the compute warps take each ``x`` tile into registers, round it to bf16 there (the same
rounding as the cast) and feed it to ``warpgroup_mma`` as its register operand, with ``W``'s tile
read from shared memory; the products accumulate in fp32 and leave as bf16 through a TMA store.
Persistent: one program per SM walks the output tiles row block by row block, so that the
programs working at one time share the same rows of ``x`` in L2.

Gluon (``triton.experimental.gluon``) changes between Triton releases; this kernel is written
for :data:`GLUON_TRITON` and runs only where :func:`gluon_input_can_run` says so. Everywhere else
the layer keeps the cast and ``torch.matmul`` (the reference this kernel is tested against).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

# The Triton release whose Gluon this module is written for (its API moved in every release).
GLUON_TRITON = "3.6."

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    HAS_GLUON = triton.__version__.startswith(GLUON_TRITON)
except ImportError:
    HAS_GLUON = False


@dataclass(frozen=True)
class InputProductTiles:
    """The kernel's tiling: a row block of ``block_m`` rows of x rounded once into shared memory,
    output tiles of ``block_m x block_n`` from it, reduced ``block_k`` columns at a time with W's
    blocks through a ring of ``stages`` shared-memory buffers, by ``num_warps`` compute warps."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    stages: int = 4
    convert_warps: int = 4
    convert_registers: int = 152
    mma_registers: int = 168
    in_flight: int = 1

    def shared_bytes(self, columns: int) -> int:
        """Shared memory the tiling takes for an x of ``columns`` columns: the row block (bf16),
        W's ring and the output's staging tile."""
        return (self.block_m * columns + self.stages * self.block_n * self.block_k + self.block_m * self.block_n) * 2


# An H100's shared memory per block (227 KiB), less room for the ring's barriers.
SHARED_MEMORY_LIMIT = 227 * 1024 - 1024


def gluon_input_can_run(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether :func:`cast_product` takes these operands: Gluon of :data:`GLUON_TRITON` present,
    a Hopper GPU (compute capability 9.x), ``x`` fp32 and ``weight`` bf16 both contiguous, ``out``
    bf16 with unit column stride, and every address and row stride TMA's 16-byte multiple."""
    if not (HAS_GLUON and x.is_cuda and torch.cuda.get_device_capability(x.device)[0] == 9):
        return False
    if x.dtype != torch.float32 or weight.dtype != torch.bfloat16 or out.dtype != torch.bfloat16:
        return False
    if x.dim() != 2 or weight.dim() != 2 or out.dim() != 2 or not (x.is_contiguous() and weight.is_contiguous()):
        return False
    if out.stride(1) != 1 or out.shape != (x.shape[0], weight.shape[0]) or x.shape[1] != weight.shape[1]:
        return False
    return all(t.data_ptr() % 16 == 0 for t in (x, weight, out)) and (out.stride(0) * 2) % 16 == 0 and (
        x.shape[1] * 2
    ) % 16 == 0


if HAS_GLUON:

    @gluon.jit
    def _load_partition(x, rows, w_desc, out_desc, x_blocks, w_ring, out_tiles, ready, empty, x_ready, x_free,
                        row_blocks, COLUMN_TILES: gl.constexpr, K_STEPS: gl.constexpr, CONVERT_WARPS: gl.constexpr,
                        IN_FLIGHT: gl.constexpr):
        """The load warp: W's blocks by TMA, tile after tile of every row block."""
        stages: gl.constexpr = w_ring.type.shape[0]
        block_n: gl.constexpr = w_desc.block_type.shape[0]
        block_k: gl.constexpr = w_desc.block_type.shape[1]
        step = 0
        for _ in range(gl.program_id(0), row_blocks, gl.num_programs(0)):
            for column_tile in range(COLUMN_TILES):
                for k in range(K_STEPS):
                    stage = step % stages
                    mbarrier.wait(empty.index(stage), ((step // stages) & 1) ^ 1)
                    mbarrier.expect(ready.index(stage), w_desc.block_type.nbytes)
                    tma.async_copy_global_to_shared(
                        w_desc, [column_tile * block_n, k * block_k], ready.index(stage), w_ring.index(stage)
                    )
                    step += 1

    @gluon.jit
    def _convert_partition(x, rows, w_desc, out_desc, x_blocks, w_ring, out_tiles, ready, empty, x_ready, x_free,
                           row_blocks, COLUMN_TILES: gl.constexpr, K_STEPS: gl.constexpr, CONVERT_WARPS: gl.constexpr,
                        IN_FLIGHT: gl.constexpr):
        """The converting warps: each row block of x read in fp32 (two blocks of columns in flight)
        and rounded to bf16 into ``x_blocks``, a block of columns as soon as the last tile of the row
        block before has done with it, so that the rounding hides under that tile's products."""
        block_m: gl.constexpr = x_blocks.type.shape[1]
        block_k: gl.constexpr = x_blocks.type.shape[2]
        # Half a block of rows at a time, the next one's load in flight while this one is stored.
        half: gl.constexpr = block_m // 2
        layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 * 4 // block_k, block_k // 4], [CONVERT_WARPS, 1], [1, 0])
        offsets_m = gl.arange(0, half, layout=gl.SliceLayout(1, layout))
        offsets = offsets_m[:, None] * (K_STEPS * block_k) + gl.arange(0, block_k, layout=gl.SliceLayout(0, layout))[None, :]
        visit = 0
        for block in range(gl.program_id(0), row_blocks, gl.num_programs(0)):
            row = block * block_m
            base = x + row.to(gl.int64) * (K_STEPS * block_k)
            columns = gl.load(base + offsets, mask=(row + offsets_m < rows)[:, None], other=0.0)
            for k in gl.static_range(K_STEPS):
                for h in gl.static_range(2):
                    if k + h < K_STEPS:
                        following = gl.load(
                            base + (1 - h) * half * (K_STEPS * block_k) + (k + h) * block_k + offsets,
                            mask=(row + (1 - h) * half + offsets_m < rows)[:, None], other=0.0,
                        )
                    if h == 0:
                        # Barriers start as if their phase 1 had completed: the first row block's waits pass.
                        mbarrier.wait(x_free.index(k), (visit & 1) ^ 1)
                    x_blocks.index(k).slice(h * half, half, dim=0).store(columns.to(gl.bfloat16))
                    if h == 1:
                        fence_async_shared()
                        mbarrier.arrive(x_ready.index(k), count=1)
                    if k + h < K_STEPS:
                        columns = following
            visit += 1

    @gluon.jit
    def _mma_rows(out_desc, x_blocks, w_ring, out_tiles, ready, empty, x_ready, x_free, row_blocks,
                  COLUMN_TILES: gl.constexpr, K_STEPS: gl.constexpr, IN_FLIGHT: gl.constexpr, HALF: gl.constexpr):
        """One warpgroup's products: its half of the rows of every output tile of a row block, from
        the block's bf16 copy by ``warpgroup_mma`` (one product in flight while the next is issued),
        each half tile leaving through its own staging tile by TMA. The two warpgroups share W's
        ring but not their epilogues, so one stores while the other multiplies. In the last tile of
        a row block each block of columns goes back to the converting warps once both are done."""
        stages: gl.constexpr = w_ring.type.shape[0]
        half_m: gl.constexpr = out_desc.block_type.shape[0]
        block_n: gl.constexpr = out_desc.block_type.shape[1]
        accumulator_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, block_n, 16]
        )
        out_tile = out_tiles.index(HALF)
        step = 0
        visit = 0
        for block in range(gl.program_id(0), row_blocks, gl.num_programs(0)):
            for column_tile in range(COLUMN_TILES):
                last = column_tile == COLUMN_TILES - 1
                acc = gl.zeros([half_m, block_n], gl.float32, accumulator_layout)
                for k in gl.static_range(K_STEPS):
                    mbarrier.wait(x_ready.index(k), visit & 1, pred=column_tile == 0)
                    stage = step % stages
                    mbarrier.wait(ready.index(stage), (step // stages) & 1)
                    rows_k = x_blocks.index(k).slice(HALF * half_m, half_m, dim=0)
                    acc = warpgroup_mma(rows_k, w_ring.index(stage).permute((1, 0)), acc, is_async=True)
                    acc = warpgroup_mma_wait(num_outstanding=IN_FLIGHT, deps=(acc,))
                    # The product IN_FLIGHT before this one is done: its blocks may be loaded again.
                    if k >= IN_FLIGHT:
                        mbarrier.arrive(empty.index((step + stages - IN_FLIGHT) % stages), count=1)
                        mbarrier.arrive(x_free.index(k - IN_FLIGHT), count=1, pred=last)
                    step += 1
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                for done in gl.static_range(IN_FLIGHT):
                    mbarrier.arrive(empty.index((step + stages - IN_FLIGHT + done) % stages), count=1)
                    mbarrier.arrive(x_free.index(K_STEPS - IN_FLIGHT + done), count=1, pred=last)
                # The previous tile's store must have read the staging tile before it is written again.
                tma.store_wait(pendings=0)
                out_tile.store(acc.to(out_desc.dtype))
                fence_async_shared()
                tma.async_copy_shared_to_global(
                    out_desc, [(2 * block + HALF) * half_m, column_tile * block_n], out_tile
                )
            visit += 1
        tma.store_wait(pendings=0)

    @gluon.jit
    def _mma_first_half(out_desc, x_blocks, w_ring, out_tiles, ready, empty, x_ready, x_free, row_blocks,
                        COLUMN_TILES: gl.constexpr, K_STEPS: gl.constexpr, IN_FLIGHT: gl.constexpr):
        """The default partition: the first half of every tile's rows."""
        _mma_rows(out_desc, x_blocks, w_ring, out_tiles, ready, empty, x_ready, x_free, row_blocks, COLUMN_TILES,
                  K_STEPS, IN_FLIGHT, 0)

    @gluon.jit
    def _mma_second_half(x, rows, w_desc, out_desc, x_blocks, w_ring, out_tiles, ready, empty, x_ready, x_free,
                         row_blocks, COLUMN_TILES: gl.constexpr, K_STEPS: gl.constexpr, CONVERT_WARPS: gl.constexpr,
                        IN_FLIGHT: gl.constexpr):
        """A worker partition: the second half of every tile's rows."""
        _mma_rows(out_desc, x_blocks, w_ring, out_tiles, ready, empty, x_ready, x_free, row_blocks, COLUMN_TILES,
                  K_STEPS, IN_FLIGHT, 1)

    @gluon.jit
    def cast_product_kernel(x, rows, w_desc, out_desc, row_blocks, COLUMN_TILES: gl.constexpr,
                            K_STEPS: gl.constexpr, STAGES: gl.constexpr, CONVERT_WARPS: gl.constexpr,
                            CONVERT_REGISTERS: gl.constexpr, MMA_REGISTERS: gl.constexpr, IN_FLIGHT: gl.constexpr):
        """``out = bf16(x) @ W^T``, row blocks ``program_id, program_id + programs, ...`` of x
        (``rows x K_STEPS * block_k``, contiguous), each rounded once into shared memory; ``out_desc``
        has blocks of half a row block's rows."""
        half_m: gl.constexpr = out_desc.block_type.shape[0]
        block_k: gl.constexpr = w_desc.block_type.shape[1]
        x_blocks = gl.allocate_shared_memory(
            gl.bfloat16, [K_STEPS, 2 * half_m, block_k],
            gl.NVMMASharedLayout.get_default_for([2 * half_m, block_k], gl.bfloat16),
        )
        w_ring = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
        out_tiles = gl.allocate_shared_memory(out_desc.dtype, [2] + out_desc.block_type.shape, out_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        x_ready = gl.allocate_shared_memory(gl.int64, [K_STEPS, 1], mbarrier.MBarrierLayout())
        x_free = gl.allocate_shared_memory(gl.int64, [K_STEPS, 1], mbarrier.MBarrierLayout())
        # A ring stage and a block of x's columns are free again once both warpgroups are done with them.
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)
        for i in gl.static_range(K_STEPS):
            mbarrier.init(x_ready.index(i), count=1)
            mbarrier.init(x_free.index(i), count=2)
        gl.warp_specialize(
            [
                (_mma_first_half, (out_desc, x_blocks, w_ring, out_tiles, ready, empty, x_ready, x_free, row_blocks,
                                   COLUMN_TILES, K_STEPS, IN_FLIGHT)),
                (_load_partition, (x, rows, w_desc, out_desc, x_blocks, w_ring, out_tiles, ready, empty, x_ready,
                                   x_free, row_blocks, COLUMN_TILES, K_STEPS, CONVERT_WARPS, IN_FLIGHT)),
                (_convert_partition, (x, rows, w_desc, out_desc, x_blocks, w_ring, out_tiles, ready, empty, x_ready,
                                      x_free, row_blocks, COLUMN_TILES, K_STEPS, CONVERT_WARPS, IN_FLIGHT)),
                (_mma_second_half, (x, rows, w_desc, out_desc, x_blocks, w_ring, out_tiles, ready, empty, x_ready,
                                    x_free, row_blocks, COLUMN_TILES, K_STEPS, CONVERT_WARPS, IN_FLIGHT)),
            ],
            [1, CONVERT_WARPS, 4],
            [24, CONVERT_REGISTERS, MMA_REGISTERS],
        )


def launch_options(tiles: InputProductTiles) -> dict:
    """The launch's options: the first compute warpgroup (the default partition), and the register
    cap of the whole program, which ``warp_specialize`` shares out: 24 a thread to the load warp's
    warpgroup, ``convert_registers`` to the converting warps, ``mma_registers`` to the second
    compute warpgroup and the rest to the first."""
    threads = (4 + 4 + tiles.convert_warps + 4) * 32
    return {"num_warps": 4, "maxnreg": min(255, 65536 // threads) // 8 * 8}


def cast_product(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, tiles: InputProductTiles | None = None):
    """``out[:] = bf16(x) @ weight^T`` for ``x [M, K]`` fp32, ``weight [N, K]`` bf16 and ``out
    [M, N]`` bf16 (any row stride), where :func:`gluon_input_can_run` holds."""
    tiles = tiles or InputProductTiles()
    if tiles.shared_bytes(x.shape[1]) > SHARED_MEMORY_LIMIT:
        raise ValueError(
            f"{tiles} needs {tiles.shared_bytes(x.shape[1])} bytes of shared memory; at most {SHARED_MEMORY_LIMIT}"
        )
    if x.shape[1] % tiles.block_k:
        raise ValueError(f"x's {x.shape[1]} columns are not a multiple of block_k {tiles.block_k}")
    w_layout = gl.NVMMASharedLayout.get_default_for([tiles.block_n, tiles.block_k], gl.bfloat16)
    w_desc = TensorDescriptor.from_tensor(weight, [tiles.block_n, tiles.block_k], w_layout)
    row_blocks = triton.cdiv(x.shape[0], tiles.block_m)
    programs = min(row_blocks, torch.cuda.get_device_properties(x.device).multi_processor_count)
    half = [tiles.block_m // 2, tiles.block_n]
    out_desc = TensorDescriptor(
        out, list(out.shape), list(out.stride()), half, gl.NVMMASharedLayout.get_default_for(half, gl.bfloat16)
    )
    cast_product_kernel[(programs,)](
        x, x.shape[0], w_desc, out_desc, row_blocks, triton.cdiv(weight.shape[0], tiles.block_n),
        x.shape[1] // tiles.block_k, tiles.stages, tiles.convert_warps, tiles.convert_registers, tiles.mma_registers,
        tiles.in_flight, **launch_options(tiles),
    )
