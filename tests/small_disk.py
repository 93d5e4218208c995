"""A small disk for one process tree: a tmpfs of a few MiB mounted on a folder in a private mount
namespace (``unshare --mount --propagation private``), which this machine's other processes never
see. A holder process keeps the namespace alive; :attr:`SmallDisk.enter` is the command prefix that
runs a process in it (``nsenter``), and :meth:`SmallDisk.outside` is the path by which this process
reaches a file on the small disk (through ``/proc/HOLDER/root``). :meth:`fill` takes every free
block (ENOSPC for whoever writes next), :meth:`free` gives them back. Needs root with CAP_SYS_ADMIN:
:func:`unavailable` says why not, for a test's skip.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

FILLER = ".filler"


def unavailable() -> str:
    """Why this machine cannot make a small disk for a process tree here, or ``""``."""
    if not os.uname().sysname == "Linux":
        return "needs Linux"
    if os.geteuid() != 0:
        return "needs root (to mount a tmpfs in a private mount namespace)"
    for tool in ("unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"needs {tool} (util-linux)"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/mnt"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"cannot mount a tmpfs in a private mount namespace here: {probe.stderr.strip()}"
    return ""


def fill_folder(folder: Path) -> None:
    """Take every free block of ``folder``'s disk with the file ``folder/.filler``."""
    chunk = b"\0" * 65536
    with open(folder / FILLER, "ab", buffering=0) as filler:
        while True:
            try:
                filler.write(chunk)  # unbuffered: a partial write takes the last blocks, the next fails
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
                return


class SmallDisk:
    """A tmpfs of ``size_mb`` MiB on ``folder`` (made if missing), seen only by processes run with
    :attr:`enter`; ``options``: tmpfs's mount options (``uid=N,gid=N,mode=0700``)."""

    def __init__(self, folder: Path, size_mb: int, options: str = "mode=0755"):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        script = f'mount -t tmpfs -o size={size_mb}m,{options} tmpfs "$1" && echo mounted && exec sleep infinity'
        self._holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(self.folder)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self._holder.stdout is not None
        if self._holder.stdout.readline().strip() != "mounted":
            self._holder.kill()
            raise RuntimeError(f"could not mount the small disk: {self._holder.communicate()[1]}")
        self.enter = ["nsenter", f"--mount=/proc/{self._holder.pid}/ns/mnt", f"--wd={self.folder}", "--"]

    def outside(self, path: Path | str = "") -> Path:
        """``path`` (on the small disk, absolute or relative to its folder) as this process reaches it."""
        full = self.folder / path
        return Path(f"/proc/{self._holder.pid}/root") / full.relative_to("/")

    def fill(self) -> None:
        """Take every free block: the next write to the small disk that needs one fails with ENOSPC."""
        fill_folder(self.outside())

    def free(self) -> None:
        """Give back what :meth:`fill` took."""
        self.outside(FILLER).unlink(missing_ok=True)

    def remount(self, options: str) -> None:
        """Mount the small disk again with ``options`` (``ro``: read-only; refused while a file on it
        is open for writing)."""
        subprocess.run([*self.enter, "mount", "-o", f"remount,{options}", str(self.folder)], check=True)

    def close(self) -> None:
        """End the holder: the namespace, and the tmpfs with everything on it, are gone once the
        processes run in it have ended too."""
        self._holder.kill()
        self._holder.wait()

    def __enter__(self) -> SmallDisk:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
