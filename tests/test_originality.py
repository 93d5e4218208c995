"""What counts as a copy (quasar/originality.py): the normalised kernel content hash, on the starter
fork's real kernel files reformatted as a copier would, and the copy rule; plus how a validator's
worker reads a checkout's kernel directory (quasar/validator/worker.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from quasar.originality import (
    SAME_COMMIT,
    SAME_CONTENT,
    CopyOf,
    Fingerprint,
    content_hash,
    find_copies,
    normalised_file,
)
from quasar.validator import worker
from quasar.validator.worker import kernel_content_hash

KERNEL = Path(__file__).resolve().parents[1] / "quasar" / "starter_fork" / "tree" / "fla" / "ops" / "quasar"


def kernel_files() -> dict[str, bytes]:
    return {
        path.relative_to(KERNEL).as_posix(): path.read_bytes()
        for path in sorted(KERNEL.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def disguised_python(source: str) -> str:
    """What a copier does to hide a copy without changing the code: comments and docstrings swapped,
    two-space indentation, blank lines, spaces around operators, parentheses kept or added."""
    lines = []
    for line in source.splitlines():
        stripped = line.lstrip(" ")
        indent = (len(line) - len(stripped)) // 4 * 2 + (len(line) - len(stripped)) % 4
        if stripped.startswith("#"):
            lines.append(" " * indent + "# my own optimisation notes")
            continue
        lines.append(" " * indent + re.sub(r"  # .*$", "  # tuned by me", stripped))
        lines.append("")
    text = "\n".join(lines) + "\n"
    return re.sub(r'"""(.*?)"""', '"""Written from scratch."""', text, flags=re.DOTALL)


def test_the_starter_forks_kernel_disguised_hashes_the_same_and_a_real_change_does_not():
    files = kernel_files()
    assert {"chunk.py", "gate.py", "csrc/quasar_recurrent.cu", "tuning.json"} <= set(files)
    original = content_hash(files)
    disguised = dict(files)
    for name, data in files.items():
        if name.endswith(".py"):
            disguised[name] = disguised_python(data.decode()).encode()
            assert disguised[name] != data
    cuda = files["csrc/quasar_recurrent.cu"].decode()
    disguised["csrc/quasar_recurrent.cu"] = (
        "/* my kernel */\n" + re.sub(r"[ \t]+", "  ", cuda).replace("\n", "\n\n") + "\n// end\n"
    ).encode()
    disguised["tuning.json"] = json.dumps(json.loads(files["tuning.json"]), indent=7).encode()
    assert content_hash(disguised) == original
    # A real change: one constant, one file more, or a file moved.
    changed = dict(files)
    changed["gate.py"] = (
        files["gate.py"].replace(b"1e-8", b"1e-7")
        if b"1e-8" in files["gate.py"]
        else files["gate.py"] + b"\nEXTRA = 1\n"
    )
    assert content_hash(changed) != original
    assert content_hash({**files, "helper.py": b"X = 1\n"}) != original
    moved = {("moved/" + name if name == "gate.py" else name): data for name, data in files.items()}
    assert content_hash(moved) != original


def test_c_sources_lose_comments_and_spacing_but_not_strings():
    assert normalised_file("k.cu", b"int a = b + c; // sum\n/* block\ncomment */ return a;") == normalised_file(
        "k.cu", b"int a=b+c;\n\n   return a ;"
    )
    assert normalised_file("k.cu", b'printf("// not a comment");') != normalised_file("k.cu", b'printf("");')
    assert normalised_file("k.cu", b"int a;") != normalised_file("k.cu", b"int b;")


def test_python_that_does_not_parse_and_binary_files_still_hash():
    assert normalised_file("bad.py", b"def (:\n  x") == normalised_file("bad.py", b"def  (:\n\n x")
    assert normalised_file("blob.bin", b"\x00\xff  \x01") != normalised_file("blob.bin", b"\x00\xfe  \x01")
    assert normalised_file("bad.json", b"{not json") == b"{not json"


def fp(submission_id: int, hotkey: str, commit: str | None = None, content: str | None = None) -> Fingerprint:
    return Fingerprint(submission_id, hotkey, commit, content)


def test_a_copy_is_another_hotkeys_later_submission_of_the_same_commit_or_content():
    prints = [
        fp(1, "author", "c1", "k1"),
        fp(2, "copier", "c1", None),  # the same commit, before any validator reported its content
        fp(3, "copier", "c9", "k1"),  # the same kernel files under a commit of its own
        fp(4, "author", "c5", "k1"),  # the author resubmitting its own kernel: not a copy
        fp(5, "other", "c6", "k2"),
        fp(6, "copier", "c1", "k3"),  # the commit decides even when a lying validator reported other content
    ]
    assert find_copies(prints) == {
        2: CopyOf(2, 1, "author", SAME_COMMIT),
        3: CopyOf(3, 1, "author", SAME_CONTENT),
        6: CopyOf(6, 1, "author", SAME_COMMIT),
    }
    assert "a copy of submission 1 by author, made earlier with the same kernel files" in find_copies(prints)[3].reason
    # The order of the input does not matter: ids say who came first.
    assert find_copies(reversed(prints)) == find_copies(prints)
    # A copier who got in first is the original; the author's later submission is then the copy.
    assert find_copies([fp(7, "copier", "c7"), fp(8, "author", "c7")]) == {8: CopyOf(8, 7, "copier", SAME_COMMIT)}


def test_a_checkouts_kernel_hash_skips_links_caches_and_refuses_what_is_too_large(tmp_path, monkeypatch):
    checkout = tmp_path / "fork"
    kernel = checkout / "fla" / "ops" / "quasar"
    assert kernel_content_hash(checkout) is None  # no kernel directory
    (kernel / "__pycache__").mkdir(parents=True)
    (kernel / "chunk.py").write_text("X = 1  # a\n")
    (kernel / "__pycache__" / "chunk.cpython-311.pyc").write_bytes(b"\x00" * 64)
    (kernel / "stray.pyc").write_bytes(b"\x00")
    secret = tmp_path / "secret.txt"
    secret.write_text("validator secret")
    os.symlink(secret, kernel / "leak.txt")
    os.symlink(tmp_path, kernel / "up")
    assert kernel_content_hash(checkout) == content_hash({"chunk.py": b"X = 1\n"})
    monkeypatch.setattr(worker, "MAX_KERNEL_FILES", 1)
    (kernel / "gate.py").write_text("Y = 2\n")
    assert kernel_content_hash(checkout) is None
    linked = tmp_path / "linked"
    (linked / "fla" / "ops").mkdir(parents=True)
    os.symlink(kernel, linked / "fla" / "ops" / "quasar")
    assert kernel_content_hash(linked) is None  # the kernel directory itself a link: not followed


@pytest.mark.parametrize("name", ["a.py", "a.cu", "a.json", "a.txt"])
def test_normalising_never_raises_on_hostile_input(name):
    hostile = [b"(" * 200_000, b"\xff\xfe" * 1000, b"\x00" * 10, b"[" * 100_000, "é".encode() * 10]
    for data in hostile:
        assert isinstance(normalised_file(name, data), bytes)
