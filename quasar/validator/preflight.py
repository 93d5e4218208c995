"""What a validator checks before it starts: its wallet and its registration (its devices: devices.py).

Each check raises :class:`ValidatorSetupError` with a message that names what is wrong and how to fix it.
"""

from __future__ import annotations

import logging

import bittensor as bt

from quasar.chain.base import Chain
from quasar.config import DEV_NETWORK, Settings
from quasar.validator.devices import ValidatorSetupError

logger = logging.getLogger(__name__)


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
