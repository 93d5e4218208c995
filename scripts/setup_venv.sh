#!/usr/bin/env bash
# Create .venv when missing and install the project into it with its test extras; reinstall only
# when the dependency files changed since the last install. Used by ./scripts/test.sh and
# ./START_LOCALNET.sh; run from anywhere.
#
# Settings (environment):
#   PYTHON=python3            the interpreter the venv is made from
#   QUASAR_WHEELHOUSE=DIR     install offline from a folder of wheels (no package index)
#   QUASAR_TORCH_SITE=DIR     a site-packages folder that already holds a CUDA build of torch and
#                             triton (a GPU machine's image): the venv reads what it lacks from
#                             there, and pyproject.toml's torch and triton are not installed
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
# .venv's python runs under a UTF-8 locale here: pip's editable install writes the checkout's path
# into a .pth file in the locale's encoding, which under LANG=C cannot hold a non-ASCII path.
python=(env LC_ALL=C.UTF-8 .venv/bin/python)

# requirements GROUP: one requirement a line from pyproject.toml, the one place they are written:
# "runtime" (the project's dependencies), an optional group ("test"), or a [tool.quasar.off-path] one.
requirements() {
    "${python[@]}" - "$1" <<'PY'
import sys
import tomllib

with open("pyproject.toml", "rb") as file:
    pyproject = tomllib.load(file)
group = sys.argv[1]
project = pyproject["project"]
groups = {"runtime": project["dependencies"], **project["optional-dependencies"],
          **pyproject["tool"]["quasar"]["off-path"]}
print("\n".join(groups[group]))
PY
}

# Python 3.11 reads .pth files in the locale's encoding (ASCII under LANG=C), and one it cannot
# decode stops every start of .venv's python: a path line of .venv's .pth files (the editable
# install's checkout) that is not ASCII becomes an import line adding it, its characters escaped.
# Run at every call, so a .venv set up by an earlier version of this script is repaired too.
ascii_pth_files() {
    "${python[@]}" - <<'PY'
import glob
import os
import sysconfig

for pth in glob.glob(os.path.join(sysconfig.get_paths()["purelib"], "*.pth")):
    with open(pth, encoding="utf-8") as file:
        lines = file.read().splitlines()
    if all(line.isascii() for line in lines):
        continue
    escaped = [
        line if line.isascii() or line.startswith(("import ", "import\t", "#"))
        else f"import sys; {ascii(line)} in sys.path or sys.path.append({ascii(line)})"
        for line in lines
    ]
    with open(pth, "w", encoding="ascii") as file:
        file.write("".join(f"{line}\n" for line in escaped))
PY
}

stamp=.venv/.quasar-install-stamp
wanted=$( (cat pyproject.toml; echo "${QUASAR_TORCH_SITE:-}") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    echo "setup_venv: installing the project into .venv (the first time takes minutes)" >&2
    pip=("${python[@]}" -m pip install -q)
    if [ -n "${QUASAR_WHEELHOUSE:-}" ]; then
        pip+=(--no-index --find-links "$QUASAR_WHEELHOUSE")
    else
        "${pip[@]}" --upgrade pip
    fi
    if [ -n "${QUASAR_TORCH_SITE:-}" ]; then
        site=$("${python[@]}" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo "$QUASAR_TORCH_SITE" > "$site/quasar-torch-site.pth"
        requirements runtime | grep -vE '^(torch|triton)\b' > .venv/requirements-without-torch.txt
        requirements test > .venv/requirements-test.txt
        "${pip[@]}" -r .venv/requirements-without-torch.txt -r .venv/requirements-test.txt
        "${pip[@]}" --no-deps -e .
    else
        # torch first and exactly as pinned, so nothing that depends on it pulls another build.
        "${pip[@]}" "$(requirements runtime | grep -E '^torch==')"
        "${pip[@]}" -e ".[test]"
    fi
    rm -rf .venv/upstream-fla .venv/triton-gpu-image
    requirements upstream-fla > .venv/requirements-upstream-fla.txt
    requirements gpu-image-triton > .venv/requirements-gpu-image-triton.txt
    "${pip[@]}" --no-deps --target .venv/upstream-fla -r .venv/requirements-upstream-fla.txt
    "${pip[@]}" --no-deps --target .venv/triton-gpu-image -r .venv/requirements-gpu-image-triton.txt
    echo "$wanted" > "$stamp"
fi
ascii_pth_files
