"""What a validator checks before it starts: its wallet, its devices, its registration.

Each check raises :class:`ValidatorSetupError` with a message that names what is wrong and how to
fix it; the device rules are pure functions of the settings and what torch sees.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import bittensor as bt

from quasar.chain.base import Chain
from quasar.config import DEV_NETWORK, Settings

logger = logging.getLogger(__name__)

CPU_WARNING = ("DEVICE=cpu on {network}: CPU evaluations are not benchmarks (tests and small lengths only); "
               "the tokens/sec this validator reports and ranks by are not comparable to a GPU's")


class ValidatorSetupError(RuntimeError):
    """The validator cannot start as configured; the message says what to fix."""


@dataclass(frozen=True)
class Device:
    """Where one evaluation at a time runs: ``name`` as logged, and the ``CUDA_VISIBLE_DEVICES``
    the evaluation's processes get (empty on CPU), so each sees only its own GPU as ``cuda``."""

    name: str
    cuda_visible_devices: str

    @property
    def torch_device(self) -> str:
        return "cpu" if self.name == "cpu" else "cuda"


def evaluation_devices(device: str, cuda_count: int, visible: str | None) -> list[Device]:
    """The devices evaluations run on: DEVICE=cpu gives one CPU worker, ``cuda`` one worker per
    visible GPU, ``cuda:N`` the N-th visible GPU only. ``visible`` is this process's
    ``CUDA_VISIBLE_DEVICES`` (None when unset); ``cuda_count`` what torch counts."""
    if device == "cpu":
        return [Device("cpu", "")]
    ids = [item.strip() for item in visible.split(",") if item.strip()] if visible is not None \
        else [str(index) for index in range(cuda_count)]
    ids = ids[:cuda_count]
    if not ids:
        raise ValidatorSetupError(
            f"DEVICE is {device} but torch sees no CUDA device: install the NVIDIA driver and a CUDA build of "
            "torch, or set DEVICE=cpu (dev chain and tests only: CPU results are not benchmarks)")
    if device == "cuda":
        return [Device(f"cuda:{index}", physical) for index, physical in enumerate(ids)]
    index = int(device.split(":", 1)[1])
    if index >= len(ids):
        raise ValidatorSetupError(f"DEVICE is {device} but torch sees {len(ids)} CUDA device(s) "
                                  f"(cuda:0..cuda:{len(ids) - 1})")
    return [Device(device, ids[index])]


def device_warnings(network: str, device: str) -> list[str]:
    """Warnings to log for a device choice that is allowed but not a benchmark."""
    if device == "cpu" and network != DEV_NETWORK:
        return [CPU_WARNING.format(network=network)]
    return []


def load_wallet(settings: Settings) -> bt.Wallet:
    """The validator's wallet, with its hotkey readable without a password; raises
    :class:`ValidatorSetupError` naming the missing or unreadable file."""
    name = settings.wallet_name_for("validator")
    wallet = bt.Wallet(name=name, hotkey=settings.wallet_hotkey, path=str(settings.wallet_dir))
    where = f"--wallet.path {settings.wallet_dir} --wallet.name {name} --wallet.hotkey {settings.wallet_hotkey}"
    for what, keyfile in (("coldkeypub", wallet.coldkeypub_file), ("hotkey", wallet.hotkey_file)):
        if not keyfile.exists_on_device():
            raise ValidatorSetupError(
                f"wallet {what} file {keyfile.path} does not exist ({where}): create the wallet with btcli "
                "(btcli wallet create) or point WALLET_PATH / WALLET_NAME / WALLET_HOTKEY at it")
        if not keyfile.is_readable():
            raise ValidatorSetupError(f"wallet {what} file {keyfile.path} is not readable by this user")
    if wallet.hotkey_file.is_encrypted():
        raise ValidatorSetupError(f"hotkey file {wallet.hotkey_file.path} is encrypted: a validator signs without "
                                  "a prompt, so its hotkey must be unencrypted (as btcli creates hotkeys)")
    try:
        wallet.hotkey  # noqa: B018  (loads the keypair now, so a broken file fails here)
    except Exception as error:  # noqa: BLE001  (the SDK raises several kinds for a bad key file)
        raise ValidatorSetupError(f"cannot read hotkey file {wallet.hotkey_file.path}: {error}") from None
    return wallet


def check_registration(chain: Chain, hotkey: str, network: str) -> None:
    """The hotkey must be registered on the subnet; a missing validator permit is only warned
    about (permits follow stake and can come later)."""
    neuron = chain.neuron(hotkey)
    if neuron is None:
        how = ("python -m quasar.chain.devchain --path DEVCHAIN_PATH register --hotkey HOTKEY --coldkey COLDKEY "
               "--validator" if network == DEV_NETWORK else "btcli subnet register")
        raise ValidatorSetupError(f"hotkey {hotkey} is not registered on subnet {chain.netuid} of {network}: "
                                  f"register it first ({how})")
    if not neuron.validator_permit:
        logger.warning("hotkey %s (uid %d) has no validator permit on subnet %d: the API refuses its requests "
                       "and the chain its weights until it has one", hotkey, neuron.uid, chain.netuid)
