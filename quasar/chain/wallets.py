"""Opening the Bittensor wallet a process signs with, the same way in every process.

The wallet lives under WALLET_PATH (``~`` expanded), is named by ``--wallet.name`` or by the
process's role (WALLET_MINER_NAME, WALLET_VALIDATOR_NAME), and signs with its WALLET_HOTKEY. Only
the hotkey is needed: a miner's or validator's machine need not hold the coldkey at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quasar.chain import btcli
from quasar.errors import QuasarError

if TYPE_CHECKING:
    import bittensor as bt

    from quasar.config import Settings


class WalletError(QuasarError):
    """The wallet cannot be used; the message names the file and how to create it."""


def wallet_at(settings: Settings, name: str) -> bt.Wallet:
    """The wallet ``name`` with the configured hotkey, under WALLET_PATH with ``~`` expanded."""
    import bittensor as bt

    return bt.Wallet(name=name, hotkey=settings.wallet_hotkey, path=str(settings.wallet_dir))


def owner_wallet(settings: Settings) -> bt.Wallet:
    """The subnet owner's wallet (``--wallet.name``), whose coldkey signs the subnet identity; a
    coldkey file it lacks (a wallet name or folder mistyped) is a :class:`WalletError` naming it,
    not the SDK's FileNotFoundError once the chain is reached."""
    wallet = wallet_at(settings, settings.wallet_name)
    for keyfile in (wallet.coldkeypub_file, wallet.coldkey_file):
        if not keyfile.exists_on_device():
            raise WalletError(
                f"the wallet {settings.wallet_name} has no coldkey file {keyfile.path}: name the subnet owner's "
                "wallet (its coldkey owns the subnet) with --wallet.name or WALLET_NAME, and the folder holding "
                "it with --wallet.path or WALLET_PATH"
            )
    return wallet


def open_wallet(settings: Settings, role: str) -> bt.Wallet:
    """The wallet ``role`` ("miner" or "validator") signs with, its hotkey loaded now, so a missing,
    unreadable, encrypted or broken hotkey file fails here with a :class:`WalletError` naming it."""
    name = settings.wallet_name_for(role)
    wallet = wallet_at(settings, name)
    keyfile = wallet.hotkey_file
    where = f"wallet {name}, hotkey {settings.wallet_hotkey}, under {settings.wallet_dir}"
    if not keyfile.exists_on_device():
        raise WalletError(
            f"hotkey file {keyfile.path} does not exist ({where}): create it with "
            f"`{btcli.new_hotkey(name, settings.wallet_hotkey, settings.wallet_path)}` (or the whole wallet with "
            f"`{btcli.wallet_create(name, settings.wallet_hotkey, settings.wallet_path)}`), or point WALLET_PATH, "
            "WALLET_NAME and WALLET_HOTKEY at the one you have"
        )
    if not keyfile.is_readable():
        raise WalletError(f"hotkey file {keyfile.path} is not readable by this user ({where})")
    if keyfile.is_encrypted():
        raise WalletError(
            f"hotkey file {keyfile.path} is encrypted: the {role} signs without a prompt, so its "
            "hotkey must be unencrypted (as btcli creates hotkeys)"
        )
    try:
        wallet.hotkey  # noqa: B018  (loads the keypair now, so a broken file fails here)
    except Exception as error:  # the SDK raises several kinds for a bad key file
        raise WalletError(f"cannot read hotkey file {keyfile.path} ({where}): {error}") from None
    return wallet
