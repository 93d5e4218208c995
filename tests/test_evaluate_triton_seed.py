"""The Triton cache seed (quasar/evaluate/triton_seed.py): a real sandboxed child copies the seed into
its own cache and sends its cache back; the seed's name follows what it depends on; an archive that
would write outside the seed is refused; seeding stays off where it cannot apply; the bytecode an
install left out is written before a seed is built. (A fork trying to
write into the seed: tests/test_evaluate_attacks.py; the seed sparing the starter fork's compilation
on a GPU: tests/test_evaluate_gpu.py.)"""

from __future__ import annotations

import importlib.util
import io
import random
import shutil
import sys
import tarfile
import time
from pathlib import Path

import pytest

from quasar.evaluate.environment import EvaluationEnvironment, Site, compile_bytecode
from quasar.evaluate.sandbox import SandboxPolicy
from quasar.evaluate.start import SandboxStart
from quasar.evaluate.triton_seed import (
    HARNESS_KERNELS,
    MAX_SEEDS,
    SeedError,
    build_seed,
    ensure_seed,
    seed_key,
    starter_tree,
    tree_digest,
    unpack_seed,
)
from quasar.validator.worker import with_triton_seed
from tests.processes import REPO_ROOT, needs_another_user, open_to_other_users, run_python_as_nobody


def random_cache(root: Path, rng: random.Random) -> dict[str, bytes]:
    """A folder shaped like Triton's cache (entries of a few files each), with random contents."""
    files = {}
    for _ in range(rng.randint(1, 4)):
        entry = "".join(rng.choice("0123456789abcdef") for _ in range(16))
        for name in ("kernel.cubin", "kernel.json", "__grp__kernel.json")[: rng.randint(1, 3)]:
            files[f"{entry}/{name}"] = rng.randbytes(rng.randint(0, 5000))
    for relative, content in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(content)
    return files


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def ask(start: SandboxStart, header: dict, max_payload: int = 0):
    channel = start.child.channel
    channel.send(header)
    return channel.recv(deadline=time.monotonic() + 60, max_payload=max_payload)


@pytest.mark.parametrize("seed", range(2))
def test_a_sandboxed_child_copies_the_seed_into_its_cache_and_sends_the_cache_back(tmp_path, seed):
    files = random_cache(tmp_path / "seed", random.Random(seed))
    start = SandboxStart([64], "cpu", SandboxPolicy(triton_seed=str(tmp_path / "seed")))
    try:
        child = start.wait()
        assert child.isolation == "namespaces"
        assert child.seeded_files == len(files)
        reply, archive = ask(start, {"op": "triton_cache"}, max_payload=64 << 20)
    finally:
        start.close()
    assert reply == {"ok": True, "files": len(files), "nbytes": len(archive)}
    assert unpack_seed(bytes(archive), tmp_path / "back") == len(files)
    assert files_under(tmp_path / "back") == files


def test_a_child_without_a_seed_copies_nothing(tmp_path):
    start = SandboxStart([64], "cpu", SandboxPolicy(triton_seed=str(tmp_path / "missing")))
    try:
        assert start.wait().seeded_files == 0
        reply, _ = ask(start, {"op": "triton_cache"}, max_payload=64 << 20)
    finally:
        start.close()
    assert reply["files"] == 0


def test_the_seed_is_built_from_a_run_of_the_starter_fork_in_a_sandbox(tmp_path):
    # On the CPU the starter's layer runs its PyTorch path: nothing is compiled, the seed is empty,
    # but the whole path (sandbox, load, a forward at each length, the archive, unpacking) runs.
    destination = tmp_path / "seeds" / "key"
    destination.parent.mkdir()
    assert build_seed("cpu", [64, 32], SandboxPolicy(), destination) == 0
    assert destination.is_dir() and list(destination.iterdir()) == []
    assert sorted(p.name for p in destination.parent.iterdir()) == ["key"]  # no partial folder left


def archive_of(members: list[tarfile.TarInfo], content: bytes = b"x") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for member in members:
            if member.isfile():
                member.size = len(content)
                tar.addfile(member, io.BytesIO(content))
            else:
                tar.addfile(member)
    return buffer.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


@pytest.mark.parametrize(
    "bad",
    [
        member("../outside.cubin"),
        member("entry/../../outside.cubin"),
        member("/etc/cron.d/job"),
        member("entry/link", tarfile.SYMTYPE, "/root/.bittensor"),
        member("entry/hard", tarfile.LNKTYPE, "entry/kernel.cubin"),
        member("entry/fifo", tarfile.FIFOTYPE),
    ],
    ids=["dotdot", "nested-dotdot", "absolute", "symlink", "hardlink", "fifo"],
)
def test_an_archive_that_would_write_outside_the_seed_is_refused_whole(tmp_path, bad):
    archive = archive_of([member("entry/kernel.cubin"), bad])
    with pytest.raises(SeedError, match="not a plain file"):
        unpack_seed(archive, tmp_path / "seed")
    assert not (tmp_path / "seed").exists() and not (tmp_path / "outside.cubin").exists()


def test_the_seeds_name_follows_the_gpu_and_the_starter_forks_kernels(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(starter_tree(), tree, ignore=shutil.ignore_patterns("__pycache__"))
    assert tree_digest(tree) == tree_digest(starter_tree())
    key = seed_key("NVIDIA H100 80GB HBM3", tree)
    assert key == seed_key("NVIDIA H100 80GB HBM3", tree)
    assert key != seed_key("NVIDIA H200", tree)
    kernel = tree / "fla" / "ops" / "quasar" / "wy.py"
    kernel.write_text(kernel.read_text() + "\n# tuned\n")
    assert seed_key("NVIDIA H100 80GB HBM3", tree) != key
    # A seed made before the harness's own kernels changed lacks them: a new name.
    tuned = seed_key("NVIDIA H100 80GB HBM3", tree)
    harness = tmp_path / "workload.py"
    harness.write_bytes(HARNESS_KERNELS.read_bytes() + b"\n# changed\n")
    assert seed_key("NVIDIA H100 80GB HBM3", tree, harness) != tuned
    assert seed_key("NVIDIA H100 80GB HBM3", tree, HARNESS_KERNELS) == tuned


def test_seeding_is_off_on_the_cpu_without_a_folder_and_in_a_cpu_job(tmp_path):
    policy = SandboxPolicy()
    assert ensure_seed(str(tmp_path), "cpu", [64], policy) is policy
    assert ensure_seed("", "cuda", [64], policy) is policy
    assert list(tmp_path.iterdir()) == []
    job = {
        "target_sequence_length": 64,
        "options": {"seq_lens": [], "device": "cpu", "triton_seed_dir": str(tmp_path), "policy": {}},
    }
    assert with_triton_seed(job) == job


def test_the_environments_missing_bytecode_is_written_beside_its_sources(tmp_path):
    # As an install made with PYTHONDONTWRITEBYTECODE leaves it: sources, no __pycache__.
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (tmp_path / "pkg" / "sub" / "deep.py").write_text("def f():\n    return 2\n")
    (tmp_path / "single.py").write_text("X = 3\n")
    (tmp_path / "pkg-1.0.dist-info").mkdir()
    (tmp_path / "pkg-1.0.dist-info" / "setup.py").write_text("not python at all (\n")
    site = Site(str(tmp_path), ("pkg", "pkg-1.0.dist-info", "single.py"))
    environment = EvaluationEnvironment({}, (site,), ())
    assert compile_bytecode(environment, sys.executable) is None
    tag = sys.implementation.cache_tag
    for source in ("pkg/__init__.py", "pkg/sub/deep.py", "single.py"):
        assert Path(importlib.util.cache_from_source(str(tmp_path / source))).is_file(), source
    assert tag and not (tmp_path / "pkg-1.0.dist-info" / "__pycache__").exists()


def test_a_module_that_does_not_compile_is_reported_and_the_rest_still_written(tmp_path):
    (tmp_path / "good.py").write_text("X = 1\n")
    (tmp_path / "bad.py").write_text("def broken(:\n")
    environment = EvaluationEnvironment({}, (Site(str(tmp_path), ("bad.py", "good.py")),), ())
    problem = compile_bytecode(environment, sys.executable)
    assert problem is not None and "bad.py" in problem
    assert Path(importlib.util.cache_from_source(str(tmp_path / "good.py"))).is_file()


def changing_host(monkeypatch) -> dict[str, str]:
    """A GPU host whose seeds are built by a stand-in for the sandboxed run on its GPU; setting the
    returned ``torch`` or ``gpu`` upgrades its torch or moves the evaluation to another GPU model."""
    from quasar.evaluate import triton_seed

    host = {"torch": "2.5.0", "gpu": "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(triton_seed, "gpu_model", lambda device: host["gpu"])
    monkeypatch.setattr(
        triton_seed,
        "evaluation_environment",
        lambda: EvaluationEnvironment({"torch": host["torch"], "triton": "3.1.0"}, (), ()),
    )

    def build(device, lengths, policy, destination):
        destination.mkdir()
        (destination / "kernel.cubin").write_bytes(b"\0" * 4096)
        return 1

    monkeypatch.setattr(triton_seed, "build_seed", build)
    return host


def seed_of(root: Path) -> Path:
    return Path(ensure_seed(str(root), "cuda", [64], SandboxPolicy()).triton_seed or "")


def seeds_under(root: Path) -> set[Path]:
    return {p for p in root.iterdir() if p.name != ".lock"}


def test_toolchain_upgrades_over_months_do_not_grow_the_seed_folder_without_bound(tmp_path, monkeypatch):
    host = changing_host(monkeypatch)
    root = tmp_path / "seeds"
    (root / "notes").mkdir(parents=True)  # the operator's, in a folder given to seeds too
    killed = root / f"{'0' * 24}.k1ll_d"  # left by a build killed while unpacking
    (killed / "seed").mkdir(parents=True)
    used = []
    for minor in range(12):  # a year of monthly torch upgrades: a new seed each
        host["torch"] = f"2.{minor}.0"
        used.append(seed_of(root))
    assert seeds_under(root) == set(used[-MAX_SEEDS:]) | {root / "notes"}  # the newest are kept


def test_a_seed_in_use_is_kept_when_newer_ones_are_built(tmp_path, monkeypatch):
    host = changing_host(monkeypatch)
    root = tmp_path / "seeds"
    kept = seed_of(root)
    for minor in range(6, 6 + 3 * MAX_SEEDS):
        host["torch"], host["gpu"] = f"2.{minor}.0", "NVIDIA A100-SXM4-80GB"
        seed_of(root)
        # The host's other GPU model, evaluating on the old torch between the upgrades.
        host["torch"], host["gpu"] = "2.5.0", "NVIDIA H100 80GB HBM3"
        assert seed_of(root) == kept
    assert kept.is_dir() and len(seeds_under(root)) == MAX_SEEDS
    assert len(list(root.glob("*"))) == MAX_SEEDS + 1  # and the lock


_SEED_AS_ANOTHER_USER = """
import logging, sys
from quasar.evaluate import triton_seed
from quasar.evaluate.environment import EvaluationEnvironment
from quasar.evaluate.sandbox import SandboxPolicy
logging.basicConfig(level=logging.WARNING, format="%(message)s")
triton_seed.gpu_model = lambda device: "NVIDIA H100 80GB HBM3"
triton_seed.evaluation_environment = lambda: EvaluationEnvironment({"torch": "2.5.0", "triton": "3.1.0"}, (), ())
print("seed:", triton_seed.ensure_seed(sys.argv[1], "cuda", [64], SandboxPolicy()).triton_seed)
"""


@needs_another_user
def test_a_seed_folder_of_another_unix_user_leaves_the_evaluation_compiling_everything(tmp_path):
    """One .env naming one TRITON_SEED_DIR to two Unix users (a miner and a validator of one
    checkout): the first evaluation of a GPU model without a seed there, as the user who did not make
    the folder, ended in a PermissionError on its lock file (each miner cycle, `quasar evaluate`)."""
    open_to_other_users(tmp_path)
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    (seeds / ".lock").touch()
    result = run_python_as_nobody(_SEED_AS_ANOTHER_USER, str(seeds), cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "seed: None\n"
    assert f"cannot build the Triton cache seed in {seeds} (Permission denied)" in result.stderr
    assert "give each Unix user its own TRITON_SEED_DIR" in result.stderr
