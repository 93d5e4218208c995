"""The ``btcli`` commands QUASAR's messages tell operators to run, spelled as the btcli that
pyproject.toml installs (bittensor 11) takes them: ``--wallet``, ``--wallet-hotkey``,
``--wallet-path``, ``--network`` (tests/test_btcli_commands.py checks each against ``btcli ... --help``)."""

from __future__ import annotations

import os

from quasar.config import DEV_NETWORK, Settings

# btcli's own wallet folder (bittensor.wallet.DEFAULT_WALLET_PATH), for which the commands leave
# --wallet-path out; WALLET_PATH's default is the same folder, but btcli's does not follow that setting.
DEFAULT_WALLET_PATH = "~/.bittensor/wallets"


def _wallet_flags(wallet: str, hotkey: str, wallet_path: str) -> str:
    flags = f"--wallet {wallet} --wallet-hotkey {hotkey}"
    if os.path.expanduser(wallet_path) != os.path.expanduser(DEFAULT_WALLET_PATH):
        flags += f" --wallet-path {wallet_path}"
    return flags


def _network(settings: Settings) -> str:
    return settings.chain_endpoint or settings.network


def wallet_create(wallet: str, hotkey: str, wallet_path: str = DEFAULT_WALLET_PATH) -> str:
    """Create a coldkey and a hotkey (btcli asks for the coldkey's password and shows the mnemonics)."""
    return f"btcli wallet create {_wallet_flags(wallet, hotkey, wallet_path)}"


def new_hotkey(wallet: str, hotkey: str, wallet_path: str = DEFAULT_WALLET_PATH) -> str:
    """Add a hotkey to an existing wallet."""
    return f"btcli wallet new-hotkey {_wallet_flags(wallet, hotkey, wallet_path)}"


def register(settings: Settings, wallet: str) -> str:
    """Register the settings' hotkey on their subnet (pays the subnet's registration cost)."""
    return (
        f"btcli subnets register --netuid {settings.netuid} "
        f"{_wallet_flags(wallet, settings.wallet_hotkey, settings.wallet_path)} --network {_network(settings)}"
    )


def stake_add(settings: Settings, wallet: str, amount: str = "AMOUNT") -> str:
    """Stake TAO on the settings' hotkey on their subnet (a validator permit follows stake)."""
    return (
        f"btcli stake add --netuid {settings.netuid} "
        f"{_wallet_flags(wallet, settings.wallet_hotkey, settings.wallet_path)} --amount-tao {amount} "
        f"--network {_network(settings)}"
    )


def registration_hint(settings: Settings, wallet: str, hotkey: str, validator: bool = False) -> str:
    """How to register ``hotkey``: btcli on a Bittensor network, the dev chain's CLI on devchain
    (which btcli does not know), there with stake and a permit for a ``validator``: the dev chain
    stakes only at registration."""
    if settings.network == DEV_NETWORK:
        stake = " --stake STAKE --validator" if validator else ""
        return f"quasar devchain --path {settings.devchain_path} register --hotkey {hotkey} --coldkey COLDKEY{stake}"
    return register(settings, wallet)


def permit_hint(settings: Settings, wallet: str, hotkey: str, coldkey: str) -> str:
    """How the registered validator ``hotkey`` (of ``coldkey``) gets the stake a validator permit
    follows: btcli's stake on a Bittensor network; on devchain, registering it again with stake."""
    if settings.network == DEV_NETWORK:
        devchain = f"quasar devchain --path {settings.devchain_path}"
        return (
            f"{devchain} deregister --hotkey {hotkey}, then {devchain} register --hotkey {hotkey} "
            f"--coldkey {coldkey} --stake STAKE --validator: the dev chain stakes only at registration"
        )
    return stake_add(settings, wallet)
