"""What the local network needs from this machine: free ports, its children's environment, a
data folder of its own (locked while it runs, emptied at each start) and new wallets."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from quasar import config
from quasar.localnet.options import LOCK_NAME, MARKER, ROUND_BLOCKS, WALLET_HOTKEY, LocalnetError


def child_environment(repo_root: Path) -> dict[str, str]:
    """The children's environment: this one without any QUASAR setting and reading no ``.env``
    (the children get theirs as flags, so a stray variable or the checkout's ``.env`` never points
    them at a real network), the checkout on ``PYTHONPATH``, unbuffered output and the Hugging Face
    cache only."""
    settings = {option.env for option in config.OPTIONS if option.env}
    env = {key: value for key, value in os.environ.items() if key not in settings}
    env[config.DOTENV_VARIABLE] = ""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(repo_root), env.get("PYTHONPATH"))))
    env["PYTHONUNBUFFERED"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    # Settings without a command-line flag.
    env["ROUND_BLOCKS"] = str(ROUND_BLOCKS)
    return env


def distinct_free_ports(count: int) -> list[int]:
    """``count`` different ports free on 127.0.0.1 now (each child binds its own moments later)."""
    from quasar.api.devdb import free_port

    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@contextlib.contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Hold ``data_dir``'s lock for a run; a second local network on the same folder is refused."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LocalnetError(
                f"another local network is running in {data_dir}; stop it or pass another --data-dir"
            ) from None
        yield
    finally:
        os.close(fd)


def own_data_dir_entries(data_dir: Path) -> list[Path]:
    """What ``data_dir`` holds besides its lock, when it is new, empty or made by this command (it
    holds the marker file); any other folder is refused, so a mistyped path is never wiped nor
    written into (checked before the lock file is made, and again under the lock)."""
    if not data_dir.is_dir():
        return []
    entries = [entry for entry in data_dir.iterdir() if entry.name != LOCK_NAME]
    if entries and not (data_dir / MARKER).is_file():
        raise LocalnetError(
            f"{data_dir} is not empty and was not made by the local network (no {MARKER} "
            "file in it): pass an empty or new folder with --data-dir"
        )
    return entries


def reset_data_dir(data_dir: Path) -> None:
    """Empty ``data_dir`` for a new network (:func:`own_data_dir_entries` says which folder may be)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    for entry in own_data_dir_entries(data_dir):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (data_dir / MARKER).write_text("made by python -m quasar.localnet; emptied at each start\n")
    # Git ignores the whole folder, wherever it is inside a checkout.
    (data_dir / ".gitignore").write_text("*\n")


def make_wallet(root: Path, name: str):
    """A new bittensor wallet ``name`` (coldkey and hotkey ``default``, unencrypted) under ``root``."""
    import bittensor as bt

    wallet = bt.Wallet(name=name, hotkey=WALLET_HOTKEY, path=str(root))
    wallet.create_new_coldkey(use_password=False, overwrite=True, suppress=True)
    wallet.create_new_hotkey(use_password=False, overwrite=True, suppress=True)
    return wallet


def read_weights_block(state_path: Path) -> int | None:
    """The block of the validator's last weight setting, from its state file (read while it runs);
    None before the first."""
    from quasar.validator.state_files import read_meta
    from quasar.validator.weight_setting import LAST_WEIGHTS_BLOCK

    block = read_meta(state_path, LAST_WEIGHTS_BLOCK)
    return None if block is None else int(block)
