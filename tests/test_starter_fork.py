"""The starter fork: the writer's git repository, the command line, the fork's layer against the
reference on CPU, and its Triton kernels (run by Triton's interpreter) against the naive recurrence."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import torch

from fla_package import imported_fla
from quasar.cli import main
from quasar.reference import QuasarAttentionReference, naive_quasar, relative_error
from quasar.starter_fork import (
    AUTHOR_EMAIL,
    AUTHOR_NAME,
    StarterForkError,
    copy_starter_tree,
    template_files,
    write_starter_fork,
)
from tests.gitrepo import git
from tests.processes import script_results

REPO_ROOT = Path(__file__).resolve().parents[1]

# What the issue asks the tree to hold.
REQUIRED_FILES = {
    "fla/__init__.py",
    "fla/utils.py",
    "fla/ops/utils/index.py",
    "fla/layers/quasar.py",
    "fla/ops/quasar/__init__.py",
    "fla/ops/quasar/chunk.py",
    "fla/ops/quasar/chunk_intra_token_parallel.py",
    "fla/ops/quasar/forward_substitution.py",
    "fla/ops/quasar/fused_recurrent.py",
    "fla/ops/quasar/gate.py",
    "README.md",
    "pyproject.toml",
    ".gitignore",
}


@pytest.fixture(scope="module")
def fork(tmp_path_factory) -> tuple[Path, str]:
    dest = tmp_path_factory.mktemp("starter") / "fork"
    return dest, write_starter_fork(dest)


@pytest.fixture(scope="module")
def fla(fork):
    """The fork's ``fla`` package, imported from the written fork (and removed afterwards)."""
    with imported_fla(fork[0]) as package:
        yield package


# --- the writer and the command line ---


def test_writer_commits_the_whole_template_once_on_main(fork):
    dest, commit = fork
    assert len(commit) == 40 and all(c in "0123456789abcdef" for c in commit)
    assert git(dest, "rev-parse", "HEAD") == commit
    assert git(dest, "rev-list", "--count", "HEAD") == "1"
    assert git(dest, "symbolic-ref", "--short", "HEAD") == "main"
    identity = f"{AUTHOR_NAME} <{AUTHOR_EMAIL}>"
    assert git(dest, "log", "-1", "--format=%an <%ae>|%cn <%ce>") == f"{identity}|{identity}"
    assert git(dest, "status", "--porcelain") == ""
    tracked = set(git(dest, "ls-files").splitlines())
    assert tracked == {str(p) for p in template_files()}
    assert REQUIRED_FILES <= tracked
    assert [p for p in tracked if p.endswith(".cu")], "the fork must hold a .cu file"
    assert not [p for p in tracked if Path(p).name.startswith("test_")], "nothing pytest would collect"


def test_writer_gives_the_same_commit_every_time(fork, tmp_path):
    assert write_starter_fork(tmp_path / "again") == fork[1]


def test_writer_refuses_a_non_empty_destination(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(StarterForkError, match="not empty"):
        write_starter_fork(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
    with pytest.raises(StarterForkError, match="not a folder"):
        copy_starter_tree(tmp_path / "mine.txt")


def test_writer_accepts_an_existing_empty_folder(tmp_path, fork):
    assert write_starter_fork(tmp_path) == fork[1]


def test_cli_writes_the_fork_and_prints_path_and_commit(tmp_path, capsys, fork):
    dest = tmp_path / "cli"
    assert main(["starter-fork", str(dest)]) == 0
    out = capsys.readouterr().out
    assert str(dest.resolve()) in out
    assert fork[1] in out and git(dest, "rev-parse", "HEAD") == fork[1]

    assert main(["starter-fork", str(dest)]) == 1
    assert "not empty" in capsys.readouterr().err


def test_cli_runs_as_python_dash_m_quasar(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "quasar", "starter-fork", str(tmp_path / "m")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert git(tmp_path / "m", "rev-parse", "HEAD") in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "quasar", "no-such-command"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown command 'no-such-command'" in bad.stderr


def test_fork_is_standalone_and_never_imports_quasar(fork):
    imported = set()
    for path in fork[0].rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    assert imported <= {
        "__future__",
        "contextlib",
        "dataclasses",
        "functools",
        "inspect",
        "json",
        "os",
        "pathlib",
        "typing",
        "collections",
        "torch",
        "triton",
        "fla",
    }, imported


def test_fork_passes_the_strict_import_check(fork):
    result = subprocess.run(
        [sys.executable, "-m", "quasar.imports", str(fork[0]), "--profile", "strict", "--require-cu"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- fla.utils and the index helpers ---


def test_utils_have_fla_meanings_without_a_gpu(fla):
    from fla import utils

    assert utils.IS_AMD is (torch.version.hip is not None)
    import inspect

    import triton

    supports_cache = "cache_results" in inspect.signature(triton.autotune).parameters
    assert utils.autotune_cache_kwargs == ({"cache_results": True} if supports_cache else {})
    if not torch.cuda.is_available():
        assert utils.check_shared_mem() is False and utils.check_shared_mem("hopper", 0) is False

    seen = []

    @utils.input_guard
    def record(x, *, y):
        seen.extend([x.is_contiguous(), y.is_contiguous()])
        return x + y

    x = torch.randn(4, 3).t()
    assert not x.is_contiguous()
    torch.testing.assert_close(record(x, y=x), 2 * x)
    assert seen == [True, True]

    class Double(torch.autograd.Function):
        @staticmethod
        @utils.autocast_custom_fwd
        def forward(ctx, a):
            return a * 2

        @staticmethod
        @utils.autocast_custom_bwd
        def backward(ctx, grad):
            return grad * 2

    a = torch.ones(3, requires_grad=True)
    Double.apply(a).sum().backward()
    torch.testing.assert_close(a.grad, torch.full((3,), 2.0))


def test_chunk_indices_never_cross_a_sequence(fla):
    from fla.ops.utils.index import prepare_chunk_indices, prepare_chunk_offsets

    cu = torch.tensor([0, 70, 75, 75, 203], dtype=torch.int32)
    assert prepare_chunk_indices(cu, 64).tolist() == [[0, 0], [0, 1], [1, 0], [3, 0], [3, 1]]
    assert prepare_chunk_offsets(cu, 64).tolist() == [0, 2, 3, 3, 5]
    assert prepare_chunk_indices(cu.long(), 64).dtype == torch.int32


# --- the layer on CPU against the reference ---


def make_layers(fla, mode="chunk", seed=0):
    """The fork's benchmark layer with lively random weights, and the reference holding the same."""
    from fla.layers.quasar import QuasarAttention

    torch.manual_seed(seed)
    layer = QuasarAttention(hidden_size=512, head_dim=64, num_heads=8, mode=mode, layer_idx=0)
    with torch.no_grad():
        layer.o_norm.weight.uniform_(0.5, 1.5)
        layer.g_proj[1].bias.normal_()
    reference = QuasarAttentionReference(hidden_size=512, head_dim=64, num_heads=8, mode=mode)
    reference.load_state_dict(layer.state_dict(), strict=True)
    return layer, reference


def test_layer_has_the_benchmark_parameters(fla):
    layer, reference = make_layers(fla)
    shapes = {name: list(p.shape) for name, p in layer.named_parameters()}
    assert shapes == {name: list(p.shape) for name, p in reference.named_parameters()}
    assert sum(p.numel() for p in layer.parameters()) == 1_120_840
    # And the other way round: a reference's weights drive the fork's layer.
    fresh, _ = make_layers(fla, seed=1)
    fresh.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(1, 70, 512)
    torch.testing.assert_close(fresh(x)[0], layer(x)[0])


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_layer_matches_reference_in_fp32(fla, mode):
    layer, reference = make_layers(fla, mode)
    x = torch.randn(2, 150, 512)
    with torch.no_grad():
        out, attentions, cache = layer(x)
    assert attentions is None and cache is None and out.dtype == torch.float32
    assert relative_error(out, reference(x)[0]) < 1e-5


def test_layer_matches_reference_with_bf16_inputs(fla):
    layer, reference = make_layers(fla)
    x = torch.randn(1, 200, 512)
    expected = reference(x)[0]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        autocast_out = layer(x)[0]
    assert autocast_out.dtype == torch.bfloat16
    assert relative_error(autocast_out, expected) < 2e-2

    # A layer held in bf16, against the reference holding the same rounded weights (in fp32).
    bf16_layer = layer.to(torch.bfloat16)
    reference.load_state_dict(bf16_layer.state_dict())
    x16 = x.bfloat16()
    with torch.no_grad():
        bf16_out = bf16_layer(x16)[0]
    assert bf16_out.dtype == torch.bfloat16
    assert relative_error(bf16_out, reference(x16)[0]) < 2e-2


def test_layer_keeps_padded_and_packed_sequences_apart(fla):
    layer, reference = make_layers(fla)
    x = torch.randn(2, 90, 512)
    mask = torch.ones(2, 90, dtype=torch.long)
    mask[0, :25] = 0  # left padding
    mask[1, 80:] = 0  # right padding
    with torch.no_grad():
        out = layer(x, attention_mask=mask)[0]
    expected = reference(x, attention_mask=mask)[0]
    assert relative_error(out, expected) < 1e-5
    assert out[0, :25].abs().max() == 0 and out[1, 80:].abs().max() == 0

    cu_seqlens = torch.tensor([0, 64, 67, 180], dtype=torch.int32)
    packed = torch.randn(1, 180, 512)
    with torch.no_grad():
        out = layer(packed, cu_seqlens=cu_seqlens)[0]
    assert relative_error(out, reference(packed, cu_seqlens=cu_seqlens)[0]) < 1e-5


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_layer_decodes_with_a_cache_as_it_runs_whole(fla, mode):
    from fla.models import Cache

    layer, _ = make_layers(fla, mode)
    x = torch.randn(2, 75, 512)
    with torch.no_grad():
        whole = layer(x)[0]
        cache = Cache()
        pieces = [layer(x[:, :70], past_key_values=cache, use_cache=True)[0]]
        for t in range(70, 75):
            out, _, returned = layer(x[:, t : t + 1], past_key_values=cache, use_cache=True)
            assert returned is cache
            pieces.append(out)
    assert cache.get_seq_length() == 75
    assert relative_error(torch.cat(pieces, 1), whole) < 1e-5


def test_layer_rejects_bad_arguments_clearly(fla):
    from fla.layers.quasar import QuasarAttention

    with pytest.raises(ValueError, match="mode"):
        QuasarAttention(hidden_size=64, head_dim=16, num_heads=4, mode="parallel")
    layer = QuasarAttention(hidden_size=64, head_dim=16, num_heads=4)
    with pytest.raises(ValueError, match="attention_mask"):
        layer(torch.randn(1, 8, 64), attention_mask=torch.ones(1, 1, 8))
    with pytest.raises(ValueError, match="cu_seqlens"):
        layer(torch.randn(1, 8, 64), cu_seqlens=torch.tensor([0, 5, 9]))


# --- the PyTorch paths of the ops (what runs on a machine without CUDA) ---


def random_inputs(lengths, heads=2, dim=16, dtype=torch.float64, key_scale=0.3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(1, total, heads, dim, generator=generator, dtype=dtype) for _ in range(3))
    k = k * key_scale
    beta = torch.rand(heads, generator=generator, dtype=dtype) * 2 + 0.1
    h0 = torch.randn(len(lengths), heads, dim, dim, generator=generator, dtype=dtype) * 0.1
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, beta, h0, cu


def per_sequence(recurrence, q, k, v, beta, h0, cu_seqlens):
    """``recurrence`` (a reference form: ``naive_quasar``, ``chunk_quasar_reference``) run on each
    sequence packed at the offsets ``cu_seqlens``: the outputs and final states an op returns."""
    bounds = [int(bound) for bound in cu_seqlens.tolist()]
    outputs, states = [], []
    for n in range(len(bounds) - 1):
        a, b = bounds[n], bounds[n + 1]
        o, s = recurrence(q[:, a:b], k[:, a:b], v[:, a:b], beta, h0[n : n + 1], output_final_state=True)
        outputs.append(o)
        states.append(s)
    return torch.cat(outputs, 1), torch.cat(states)


@pytest.mark.parametrize("op_name", ["chunk_quasar", "fused_recurrent_quasar"])
def test_pytorch_paths_match_naive_in_float64(fla, op_name):
    import fla.ops.quasar as ops

    op = getattr(ops, op_name)
    q, k, v, beta, h0, cu = random_inputs([70, 5, 0, 130])
    o, final = op(q, k, v, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    expected_o, expected_final = per_sequence(naive_quasar, q, k, v, beta, h0, cu)
    assert o.dtype == torch.float64
    assert relative_error(o, expected_o) < 1e-12 and relative_error(final, expected_final) < 1e-12

    batch = torch.randn(3, 65, 2, 16, dtype=torch.float64)
    o, final = op(batch, batch * 0.5, batch.flip(1), beta, output_final_state=True)
    expected_o, expected_final = naive_quasar(batch, batch * 0.5, batch.flip(1), beta, output_final_state=True)
    assert relative_error(o, expected_o) < 1e-12 and relative_error(final, expected_final) < 1e-12


def test_ops_reject_bad_shapes_clearly(fla):
    from fla.ops.quasar import chunk_quasar

    q = torch.randn(2, 10, 2, 16)
    with pytest.raises(ValueError, match="beta"):
        chunk_quasar(q, q, q, torch.ones(3))
    with pytest.raises(ValueError, match="batch size must be 1"):
        chunk_quasar(q, q, q, torch.ones(2), cu_seqlens=torch.tensor([0, 10]))
    with pytest.raises(ValueError, match="initial_state"):
        chunk_quasar(q, q, q, torch.ones(2), initial_state=torch.zeros(1, 2, 16, 16))
    with pytest.raises(ValueError, match="cu_seqlens must rise"):
        chunk_quasar(q[:1], q[:1], q[:1], torch.ones(2), cu_seqlens=torch.tensor([0, 7, 4, 10]))


def test_convolved_inputs_are_rejected_clearly_when_they_do_not_fit(fla):
    from fla.ops.quasar.chunk import chunk_quasar_norm_gated
    from fla.ops.quasar.layer_kernels import ConvolvedInputs

    heads, dim, taps, length = 2, 16, 4, 10
    projections = torch.randn(1, taps - 1 + length, 3 * heads * dim + dim)
    weight = torch.randn(3 * heads * dim, taps)
    q = torch.randn(1, length, heads, dim)
    gate = (torch.randn(1, length, dim), torch.randn(heads * dim, dim), None, torch.ones(dim), 1e-5)

    def run(q, k, v, convolved):
        return chunk_quasar_norm_gated(q, k, v, torch.ones(heads), *gate, convolved=convolved)

    with pytest.raises(ValueError, match="q must be None when convolved.fused names it"):
        run(q, q, q, ConvolvedInputs(projections, weight, "q"))
    with pytest.raises(ValueError, match="convolved.fused must be 'q'"):
        run(None, q, None, ConvolvedInputs(projections, weight, "qv"))
    with pytest.raises(ValueError, match="unit column stride"):
        run(None, q, q, ConvolvedInputs(projections.transpose(1, 2), weight, "q"))
    with pytest.raises(ValueError, match=r"weight \[3 H D, W\], contiguous"):
        run(None, q, q, ConvolvedInputs(projections, weight.t().contiguous().t(), "q"))
    with pytest.raises(ValueError, match=r"q and k must both be \[B, T, H, K\]"):
        run(None, q[:, :5], q[:, :5], ConvolvedInputs(projections, weight, "q"))
    # What fits passes every check, and is refused only for the CPU the kernels cannot run on here.
    with pytest.raises(ValueError, match="runs the Triton kernels"):
        run(None, q, q, ConvolvedInputs(projections, weight, "q"))


# --- the Triton kernels compiled for an H100 (sm_90) here, without a GPU ---


# Compiles one kernel of the fork for sm_90 with whichever Triton the child imports, and prints its
# registers per thread, global store instructions, shared-memory stores and loads of 32 bits or
# fewer and the count of barriers, read from the cubin with Triton's cuobjdump.
# argv: the fork, a folder for the cubin, and a JSON spec: the kernel's module and name, the
# ``types`` of its runtime arguments, the ``constants`` of the rest, and the launch ``options``.
COMPILE_SCRIPT = textwrap.dedent(
    """
    import importlib, json, re, subprocess, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = json.loads(sys.argv[3])
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        print(json.dumps({"missing": str(tool)}))
        sys.exit(0)
    kernel = getattr(importlib.import_module(spec["module"]), spec["kernel"])
    types = spec["types"]
    signature = {name: types.get(name, "constexpr") for name in kernel.arg_names}
    # Tensors' storage is 16-byte aligned, as Triton assumes of the pointers it launches with.
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
               if types.get(name, "").startswith("*")}
    compiled = triton.compile(ASTSource(kernel, signature=signature, constexprs=spec["constants"], attrs=aligned),
                              target=GPUTarget("cuda", 90, 32), options=spec["options"])
    cubin = Path(sys.argv[2]) / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    usage = subprocess.run([str(tool), "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                           check=True).stdout
    sass = subprocess.run([str(tool), "--dump-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    print(json.dumps({"triton": triton.__version__, "registers": int(re.search(r"REG:(\\d+)", usage).group(1)),
                      "stores": re.findall(r"\\bSTG\\.E[.\\w]*", sass),
                      "shared_scalar": re.findall(r"\\b(?:STS|LDS)(?:\\.U16|\\.U8)?(?= )", sass),
                      "barriers": len(re.findall(r"\\bBAR\\.", sass))}))
    """
)

GPU_IMAGE_TRITON = REPO_ROOT / ".venv" / "triton-gpu-image"
OFF_PATH_REQUIREMENTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["quasar"]["off-path"]
GPU_IMAGE_TRITON_VERSION = OFF_PATH_REQUIREMENTS["gpu-image-triton"][0].removeprefix("triton==")


def compiled_for_h100(fork: Path, spec: dict, folder: Path, compiler: str = "installed") -> dict:
    """:data:`COMPILE_SCRIPT`'s report on the kernel of ``spec``, compiled in a child process by the
    installed Triton or (``compiler`` "gpu-image") by the GPU images' Triton in
    ``.venv/triton-gpu-image``; the test is skipped where that Triton has no CUDA tools."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(folder / "cache")}
    if compiler == "gpu-image":
        if not (GPU_IMAGE_TRITON / "triton").is_dir():
            pytest.fail(
                f"{GPU_IMAGE_TRITON} is missing: ./scripts/setup_venv.sh installs it "
                "(pyproject.toml's gpu-image-triton)"
            )
        env["PYTHONPATH"] = str(GPU_IMAGE_TRITON)
    result = subprocess.run(
        [sys.executable, "-c", COMPILE_SCRIPT, str(fork), str(folder), json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    compiled = json.loads(result.stdout.strip().splitlines()[-1])
    if "missing" in compiled:
        pytest.skip(f"this Triton has no CUDA tools ({compiled['missing']} is missing)")
    if compiler == "gpu-image":
        assert compiled["triton"] == GPU_IMAGE_TRITON_VERSION, compiled
    return compiled


def wy_kernel_spec(tuning) -> dict:
    """:func:`compiled_for_h100`'s spec of the WY kernel at the benchmark's sizes under ``tuning``,
    without its launch options."""
    return {
        "module": "fla.ops.quasar.wy",
        "kernel": "chunk_quasar_wy_kernel",
        "types": {
            "k": "*bf16",
            "v": "*bf16",
            "beta": "*fp32",
            "w": "*bf16",
            "u": "*bf16",
            "seq_len": "i32",
            "chunks_per_sequence": "i32",
        },
        "constants": {
            "cu_seqlens": None,
            "chunk_indices": None,
            "H": 8,
            "K": 64,
            "V": 64,
            "BK": 64,
            "BV": 64,
            "PRECISION": "bf16",
            "INVERSE": tuning.wy_inverse,
            "IS_VARLEN": False,
        },
    }


@pytest.mark.slow
def test_the_wy_register_cap_reaches_the_compiler(fork, fla, tmp_path):
    from fla.ops.quasar import wy
    from fla.ops.quasar.tuning import load_tuning

    tuning = load_tuning(device="NVIDIA H100 80GB HBM3")
    assert tuning.wy_maxnreg == 168
    spec = wy_kernel_spec(tuning)
    capped = compiled_for_h100(
        fork[0], {**spec, "options": wy.launch_options(tuning.wy_warps, tuning.wy_maxnreg)}, tmp_path
    )["registers"]
    free = compiled_for_h100(fork[0], {**spec, "options": wy.launch_options(tuning.wy_warps, 0)}, tmp_path)["registers"]
    assert capped <= tuning.wy_maxnreg < free, (capped, free)


@pytest.mark.slow
def test_the_wy_pass_moves_shared_memory_in_vectors(fork, fla, tmp_path):
    # The four diagonal inverses leave their [4, 16, 16] batch by splits in registers. Summed out
    # of it under masks, each reduction crossed the warps through shared memory: 64 scalar stores
    # and 64 scalar loads a program, and the pass took 0.201 ms a 65,536-token tile on an H100
    # instead of 0.177. The blocks' alphas leave their batch the same way: computed again from
    # each block's keys, they cost 123 barriers a program instead of 97 (0.175 ms against 0.165).
    from fla.ops.quasar import wy
    from fla.ops.quasar.tuning import load_tuning

    tuning = load_tuning(device="NVIDIA H100 80GB HBM3")
    spec = {**wy_kernel_spec(tuning), "options": wy.launch_options(tuning.wy_warps, tuning.wy_maxnreg)}
    compiled = compiled_for_h100(fork[0], spec, tmp_path, "gpu-image")
    assert compiled["shared_scalar"] == [], sorted(set(compiled["shared_scalar"]))
    assert compiled["barriers"] <= 100, compiled["barriers"]


@pytest.mark.slow
@pytest.mark.parametrize("compiler", ["installed", "gpu-image"])
def test_the_conv_kernel_stores_whole_vectors(fork, fla, tmp_path, compiler):
    # Each thread's run of 8 bf16 outputs is 16 bytes, stored in one instruction. Triton 3.6 (GPU
    # images with torch 2.11) stored them 2 bytes at a time until the kernel said its columns'
    # alignment; the pinned Triton vectorised them either way. At the shipped block:
    from fla.ops.quasar.layer_kernels import CONV_BLOCK

    tokens, channels, warps = CONV_BLOCK
    spec = {
        "module": "fla.ops.quasar.layer_kernels",
        "kernel": "causal_conv_silu_kernel",
        "types": {
            "x": "*bf16",
            "w": "*fp32",
            "y": "*bf16",
            "B": "i32",
            "T": "i32",
            "stride_xb": "i32",
            "stride_xt": "i32",
        },
        "constants": {"CG": 512, "W": 4, "BT": tokens, "BC": channels, "EVEN_T": True},
        "options": {"num_warps": warps},
    }
    compiled = compiled_for_h100(fork[0], spec, tmp_path, compiler)
    assert compiled["stores"] and set(compiled["stores"]) == {"STG.E.128"}, compiled


# --- the Triton kernels, run by Triton's interpreter on the CPU ---

# Runs in a child process: TRITON_INTERPRET must be set before triton is imported.
INTERPRETER_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    sys.path.insert(0, sys.argv[1])
    from fla.ops.quasar import chunk_quasar, fused_recurrent_quasar
    from fla.ops.quasar.chunk import chunk_quasar_torch
    from fla.ops.quasar.forward_substitution import unit_lower_inverse
    from quasar.reference import naive_quasar, relative_error

    def inputs(lengths, heads, dim, key_scale, seed, batch=1):
        g = torch.Generator().manual_seed(seed)
        total = sum(lengths)
        q, k, v = (torch.randn(batch, total, heads, dim, generator=g) for _ in range(3))
        beta = torch.rand(heads, generator=g) * 2 + 0.1
        h0 = torch.randn(batch * len(lengths), heads, dim, dim, generator=g) * 0.1
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        return q, k * key_scale, v, beta, h0, cu

    def exact(q, k, v, beta, h0, cu=None):
        # float64 naive recurrence, each sequence on its own
        bounds = [0, q.shape[1]] if cu is None else cu.tolist()
        outs, states = [], []
        for n in range(len(bounds) - 1):
            a, b = bounds[n], bounds[n + 1]
            rows = slice(None) if cu is None else slice(n, n + 1)
            o, s = naive_quasar(*(x[:, a:b].double() for x in (q, k, v)), beta.double(),
                                h0[rows].double(), output_final_state=True)
            outs.append(o); states.append(s)
        return torch.cat(outs, 1), torch.cat(states)

    results = {}
    def record(name, o, final, ref_o, ref_final):
        results[name] = {"output": relative_error(o, ref_o), "final_state": relative_error(final, ref_final)}

    ops = {"chunk": chunk_quasar, "fused_recurrent": fused_recurrent_quasar}
    for op_name, op in ops.items():
        # batch of 2, T not a multiple of 64, initial and final state
        q, k, v, beta, h0, _ = inputs([130], 2, 16, 0.3, 1, batch=2)
        o, ht = op(q, k, v, beta, initial_state=h0, output_final_state=True)
        record(f"{op_name}-batch", o, ht, *exact(q, k, v, beta, h0))
        # three packed sequences of uneven lengths, one state each
        q, k, v, beta, h0, cu = inputs([70, 5, 55], 2, 16, 0.3, 2)
        o, ht = op(q, k, v, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        record(f"{op_name}-varlen", o, ht, *exact(q, k, v, beta, h0, cu))
        # keys so small that 1 - exp(-beta lambda) would cancel; no initial state to hide alpha
        q, k, v, beta, h0, _ = inputs([40], 2, 16, 1e-3, 3)
        h0 = torch.zeros_like(h0)
        o, ht = op(q, k, v, beta, output_final_state=True)
        record(f"{op_name}-small-keys", o, ht, *exact(q, k, v, beta, h0))

    # the benchmark's head size, two value blocks in the output pass
    q, k, v, beta, h0, _ = inputs([100], 2, 64, 0.15, 4)
    o, ht = chunk_quasar(q, k, v, beta, initial_state=h0, output_final_state=True)
    record("chunk-head-dim-64", o, ht, *exact(q, k, v, beta, h0))
    # bf16 inputs: fp32 inside, output in bf16
    q, k, v, beta, h0, _ = inputs([90], 2, 16, 0.3, 5)
    q, k, v = (x.bfloat16() for x in (q, k, v))
    o, ht = chunk_quasar(q, k, v, beta, initial_state=h0, output_final_state=True)
    assert o.dtype == torch.bfloat16 and ht.dtype == torch.float32
    record("chunk-bf16", o, ht, *exact(q, k, v, beta, h0))

    # the WY pass with the diagonal blocks inverted by substitution instead of as a product (the default)
    import dataclasses
    from fla.ops.quasar.chunk import chunk_quasar_fwd
    from fla.ops.quasar.tuning import DEFAULTS
    q, k, v, beta, h0, cu = inputs([70, 5, 55], 2, 64, 0.15, 8)
    substitution = dataclasses.replace(DEFAULTS, wy_inverse="substitution")
    o, ht = chunk_quasar_fwd(q, k, v, beta, h0, True, cu, tuning=substitution)
    record("chunk-substitution-inverse", o, ht, *exact(q, k, v, beta, h0, cu))

    # the substitution and the product by themselves
    L = torch.randn(4, 64, 64, generator=torch.Generator().manual_seed(6)) * 0.1
    ref = torch.linalg.inv(torch.eye(64, dtype=torch.float64) + torch.tril(L.double(), -1))
    results["forward-substitution"] = {"inverse": relative_error(unit_lower_inverse(L), ref)}
    results["product-inverse"] = {"inverse": relative_error(unit_lower_inverse(L, "product"), ref)}

    # the backward of the Triton path (it recomputes through the PyTorch path)
    q, k, v, beta, h0, _ = inputs([70], 2, 16, 0.3, 7, batch=2)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, beta, h0)]
    grads = []
    for fn in (chunk_quasar, chunk_quasar_torch):
        o, ht = fn(*leaves, output_final_state=True)
        grads.append(torch.autograd.grad(o.square().sum() + ht.square().sum(), leaves))
    results["backward"] = {name: relative_error(a, b) for name, a, b in zip("q k v beta h0".split(), *grads)}
    print(json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def interpreted(fork):
    """Errors of the Triton kernels (interpreted on the CPU) against the float64 recurrence."""
    return script_results(INTERPRETER_SCRIPT, [str(fork[0])], 240, TRITON_INTERPRET="1")


INTERPRETED_CASES = [
    f"{op}-{case}" for op in ("chunk", "fused_recurrent") for case in ("batch", "varlen", "small-keys")
] + ["chunk-head-dim-64", "chunk-substitution-inverse"]


@pytest.mark.slow
@pytest.mark.parametrize("case", INTERPRETED_CASES)
def test_triton_kernels_match_naive_under_the_interpreter(interpreted, case):
    errors = interpreted[case]
    assert errors["output"] < 1e-5 and errors["final_state"] < 1e-5, errors


@pytest.mark.slow
def test_triton_chunk_takes_bf16_inputs(interpreted):
    # W and U are stored in the inputs' dtype (as upstream fla stores w and u), so bf16 inputs
    # give the state bf16-sized errors, not only the output.
    errors = interpreted["chunk-bf16"]
    assert errors["output"] < 1e-2 and errors["final_state"] < 1e-2, errors


@pytest.mark.slow
@pytest.mark.parametrize("method", ["forward-substitution", "product-inverse"])
def test_unit_lower_inverse_kernel_inverts(interpreted, method):
    assert interpreted[method]["inverse"] < 1e-5


@pytest.mark.slow
def test_triton_chunk_backward_matches_autograd(interpreted):
    assert max(interpreted["backward"].values()) < 1e-5, interpreted["backward"]
