"""What counts as a copy (quasar/originality.py): the normalised kernel content hash, on the starter
fork's real kernel files reformatted as a copier would, and the copy rule; plus how a validator's
worker reads a checkout's kernel directory (quasar/validator/worker.py)."""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quasar import originality
from quasar.originality import (
    SAME_COMMIT,
    SAME_CONTENT,
    CopyOf,
    Fingerprint,
    canonical_tree,
    content_hash,
    find_copies,
    normalised_file,
)
from quasar.validator import worker
from quasar.validator.worker import kernel_content_hash

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "quasar" / "starter_fork" / "tree" / "fla" / "ops" / "quasar"


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


def python_sources() -> dict[str, bytes]:
    """Real Python of many styles: this package (f-strings with nested format specs, dataclasses,
    generics) and the installed transformers' Qwen2 model code."""
    import transformers.models.qwen2 as qwen2

    roots = [ROOT / "quasar", Path(qwen2.__file__).parent]
    return {str(path): path.read_bytes() for root in roots for path in sorted(root.rglob("*.py"))}


def test_the_canonical_tree_tells_apart_exactly_what_ast_dump_tells_apart():
    # The canonical form drops None and empty fields and joins f-string literals: it must not
    # thereby make two different programs look the same. Over real files, files with the same
    # canonical form are exactly those with the same ast.dump.
    dumps: dict[str, str] = {}
    canonicals: dict[str, str] = {}
    for name, data in python_sources().items():
        tree = ast.parse(data)
        dumps[name], canonicals[name] = ast.dump(tree), canonical_tree(tree)
    assert len(dumps) > 150
    pairs = {(dumps[name], canonicals[name]) for name in dumps}
    assert len(pairs) == len(set(dumps.values())) == len(set(canonicals.values()))


def test_an_fstring_split_or_padded_differently_writes_out_the_same():
    # Python 3.12.0-3.12.1 put an empty literal after a nested format spec; versions may split a
    # literal run in two. Neither changes what the f-string is.
    tree = ast.parse('f"a{x:<{w}}b c"')
    plain = canonical_tree(tree)
    statement = tree.body[0]
    assert isinstance(statement, ast.Expr) and isinstance(statement.value, ast.JoinedStr)
    fstring = statement.value
    field, last = fstring.values[1:]
    assert isinstance(field, ast.FormattedValue) and isinstance(field.format_spec, ast.JoinedStr)
    assert isinstance(last, ast.Constant) and last.value == "b c"
    field.format_spec.values.append(ast.Constant(""))
    fstring.values[-1:] = [ast.Constant("b "), ast.Constant("c")]
    assert canonical_tree(tree) == plain
    assert canonical_tree(ast.parse('f"a{x:<{w}}b  c"')) != plain


def other_pythons() -> list[str]:
    """CPython 3.11 or later on this machine other than this one's version (pyenv's and PATH's)."""
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3")))
    candidates += [found for minor in range(11, 20) if (found := shutil.which(f"python3.{minor}"))]
    by_version: dict[str, str] = {}
    for candidate in candidates:
        probe = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        version = probe.stdout.strip()
        if probe.returncode == 0 and version and tuple(map(int, version.split("."))) >= (3, 11):
            by_version.setdefault(version, candidate)
    by_version.pop("{}.{}".format(*sys.version_info[:2]), None)
    return sorted(by_version.values())


HASH_SOURCES = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from quasar.originality import content_hash
print(json.dumps({root: content_hash({str(p): p.read_bytes() for p in sorted(Path(root).rglob("*.py"))})
                  for root in sys.argv[2:]}))
"""


def test_validators_on_different_python_versions_agree_on_a_content_hash(tmp_path):
    # The attack: with validators on 3.11, 3.12 and 3.13 reporting different hashes of the same
    # kernel, no hash reaches half the stake, and a disguised copy is never found.
    pythons = other_pythons()
    if not pythons:
        pytest.skip("no other CPython 3.11+ on this machine")
    # This package's sources as they are now (f-strings with nested format specs, generics).
    sources = shutil.copytree(ROOT / "quasar", tmp_path / "quasar", ignore=shutil.ignore_patterns("__pycache__"))
    roots = [str(KERNEL), str(sources)]
    here = subprocess.run(
        [sys.executable, "-c", HASH_SOURCES, str(ROOT), *roots], capture_output=True, text=True, check=True
    )
    for python in pythons:
        there = subprocess.run(
            [python, "-I", "-c", HASH_SOURCES, str(ROOT), *roots], capture_output=True, text=True, timeout=300
        )
        assert there.returncode == 0, there.stderr
        assert json.loads(there.stdout) == json.loads(here.stdout), python


def test_c_sources_lose_comments_and_spacing_but_not_strings():
    assert normalised_file("k.cu", b"int a = b + c; // sum\n/* block\ncomment */ return a;") == normalised_file(
        "k.cu", b"int a=b+c;\n\n   return a ;"
    )
    assert normalised_file("k.cu", b'printf("// not a comment");') != normalised_file("k.cu", b'printf("");')
    assert normalised_file("k.cu", b"int a;") != normalised_file("k.cu", b"int b;")


def test_c_sources_of_unclosed_literals_and_comments_normalise_in_linear_time():
    """The attack: a kernel ``.cu`` of unclosed literals or comments (a line of ``\\"`` pairs,
    ``/* `` repeated) made the comment-stripping expression rescan the rest of the line or file
    from every quote or ``/*``: 80 KB took 30 s, a 64 MB kernel directory would hold the
    validator's worker (and a GPU) until its deadline, counted as the validator's own failure."""
    started = time.monotonic()
    for unit in (b'\\"', b"'\\", b"/* ", b'"\\"\\'):
        normalised_file("kernel.cu", unit * (40_000 // len(unit)) + b"\\")
    assert time.monotonic() - started < 1.0


def test_a_c_source_of_unclosed_block_comments_is_scanned_once():
    # Each `/*` searched the rest of the file for its `*/` again: 200 KB of them took 10 s.
    started = time.monotonic()
    normalised_file("kernel.cu", b"/* " * 66_666)
    assert time.monotonic() - started < 2.0


def test_c_sources_lose_what_one_substitution_of_literals_or_comments_would_remove():
    # The rule as one expression (quadratic on hostile input, exact on short text): a literal closes
    # on its line or its quote is an ordinary character; a comment becomes one space.
    reference = re.compile(r'("(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\')|(//[^\n]*|/\*.*?\*/)', re.DOTALL)
    rng = random.Random()
    alphabet = "\"'\\/*\n a"
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 16)))
        expected = reference.sub(lambda match: match.group(1) or " ", text)
        assert originality._without_c_comments(text) == expected, text


def test_python_that_does_not_parse_and_binary_files_still_hash():
    assert normalised_file("bad.py", b"def (:\n  x") == normalised_file("bad.py", b"def  (:\n\n x")
    assert normalised_file("blob.bin", b"\x00\xff  \x01") != normalised_file("blob.bin", b"\x00\xfe  \x01")
    assert normalised_file("bad.json", b"{not json") == b"{not json"


def fp(submission_id: int, hotkey: str, commit: str | None = None, content: str | None = None) -> Fingerprint:
    return Fingerprint(submission_id, hotkey, commit, content, counts_from_block=0)  # one block: ids decide


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


def test_a_kernel_file_name_that_is_not_utf8_is_hashed_not_a_crash_of_the_worker(tmp_path):
    """The attack: a file ``fla/ops/quasar/bad\\xff.py`` (git stores names as bytes) made the
    content hash raise UnicodeEncodeError in the validator's worker: no result, counted as the
    validator's own failure, and the fork never charged with one."""
    kernel = tmp_path / "fla" / "ops" / "quasar"
    kernel.mkdir(parents=True)
    (kernel / "chunk.py").write_text("X = 1\n")
    with open(os.path.join(os.fsencode(kernel), b"bad\xff.py"), "wb") as out:
        out.write(b"Y = 2\n")
    expected = hashlib.sha256()
    for name, source in ((b"bad\xff.py", b"Y = 2\n"), (b"chunk.py", b"X = 1\n")):
        normalised = normalised_file(name.decode(errors="surrogateescape"), source)
        expected.update(name + b"\0" + hashlib.sha256(normalised).digest())
    assert kernel_content_hash(tmp_path) == expected.hexdigest()


@pytest.mark.parametrize("name", ["a.py", "a.cu", "a.json", "a.txt"])
def test_normalising_never_raises_on_hostile_input(name):
    hostile = [b"(" * 200_000, b"\xff\xfe" * 1000, b"\x00" * 10, b"[" * 100_000, "é".encode() * 10]
    for data in hostile:
        assert isinstance(normalised_file(name, data), bytes)


def test_collapsing_whitespace_matches_its_reference_on_random_text():
    # The fast form matches only spaces; the reference drops a space on either side of every
    # punctuation mark after folding whitespace runs, as the rule reads.
    around = re.compile(rb" ?([^\w ]) ?")
    rng = random.Random()
    alphabet = b"ab_09 \t\n,.;(){}#/*\"'-\xc3\xa9\x00"
    for _ in range(20_000):
        text = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 16)))
        assert normalised_file("a.txt", text) == around.sub(rb"\1", re.sub(rb"\s+", b" ", text).strip()), text


JUNK = b"x=[" + b"0," * (512 * 1024) + b"]\n"  # 1 MiB: about 500 MB and 3 s to parse


def test_python_beyond_the_parse_limits_is_compared_with_whitespace_collapsed():
    big = b"# note\n" + JUNK[: originality.MAX_PARSED_FILE_BYTES] + b"]\n"
    assert normalised_file("big.py", big) == normalised_file("big.txt", big)
    small = b"x = 1  # a\n"
    assert normalised_file("small.py", small) == normalised_file("small.py", b"x=1\n")
    # In a directory, files parse in path order while the budget lasts.
    part = JUNK[:120_000] + b"]\n"
    files = {f"j{n}.py": part + str(n).encode() for n in range(6)}
    parsed = originality.MAX_PARSED_BYTES // len(part)
    hashes = {
        name: normalised_file(name, data, parse=index < parsed) for index, (name, data) in enumerate(files.items())
    }
    expected = hashlib.sha256()
    for name in sorted(files):
        expected.update(name.encode() + b"\0" + hashlib.sha256(hashes[name]).digest())
    assert content_hash(files) == expected.hexdigest()


def test_python_parses_up_to_128_kib_a_file_and_512_kib_a_directory():
    # docs/rules.md section 5: a parsed file's comments do not count, a file compared with its
    # whitespace collapsed keeps them.
    def python(size: int, letter: bytes) -> bytes:
        return b"x = 1\n#" + letter * (size - 7)

    kib = 1024
    assert normalised_file("k.py", python(128 * kib, b"a")) == normalised_file("k.py", python(128 * kib, b"b"))
    assert normalised_file("k.py", python(128 * kib + 1, b"a")) != normalised_file("k.py", python(128 * kib + 1, b"b"))

    # Four files of 128 KiB in path order spend the 512 KiB: the fourth is parsed, the fifth not.
    def directory(fourth: bytes, fifth: bytes) -> str:
        files = {f"{name}.py": python(128 * kib, b"a") for name in "abc"}
        return content_hash({**files, "d.py": python(128 * kib, fourth), "e.py": b"x = 1  # " + fifth})

    assert directory(b"a", b"a") == directory(b"b", b"a")
    assert directory(b"a", b"a") != directory(b"a", b"b")

    # Files of other kinds do not spend it.
    def beside_text(letter: bytes) -> str:
        return content_hash({"a.txt": b"t" * 500 * kib, "b.py": python(100 * kib, letter)})

    assert beside_text(b"a") == beside_text(b"b")


def test_only_a_leading_string_is_a_docstring_in_every_kind_of_body():
    assert content_hash({"a.py": b"0\nx = 1\n"}) != content_hash({"a.py": b"x = 1\n"})
    documented = b'async def f():\n    """Says what f does."""\n    return 1\n'
    assert content_hash({"a.py": documented}) == content_hash({"a.py": b"async def f():\n    return 1\n"})


def test_the_hash_takes_files_in_path_order_whatever_order_they_come_in():
    files = {"b.py": b"y = 2\n", "a.cu": b"int a;", "c.json": b"[1]"}
    assert content_hash(files) == content_hash(dict(sorted(files.items())))


def test_json_is_compared_as_its_parsed_value():
    assert content_hash({"c.json": b'{"b": 2, "a": 1}'}) == content_hash({"c.json": b'{"a":1,"b":2}'})


HASH_JUNK = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
sys.path.insert(0, sys.argv[1])
from tests.test_originality import JUNK
from quasar.originality import content_hash
started = time.monotonic()
content_hash({"junk.py": JUNK * 16, **{f"j{n:02}.py": JUNK[:120_000] + b"]" for n in range(40)}})
print(time.monotonic() - started)
"""


def test_a_kernel_directory_built_to_exhaust_the_parser_is_hashed_in_bounded_time():
    # The attack: files of ``x=[0,0,...]`` (git compresses them to nothing) make the content hash
    # of the validator's own process parse gigabytes of syntax tree for minutes. Run apart, with
    # its memory capped, so that a regression cannot take this machine's memory.
    run = subprocess.run(
        [sys.executable, "-c", HASH_JUNK, str(ROOT)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr
    assert float(run.stdout) < 10.0
