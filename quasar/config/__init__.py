"""Settings for every QUASAR process, read in one place.

Precedence, later wins: built-in default < ``.env`` file < process environment < command-line flag.
Flags use the usual Bittensor spelling (``--wallet.name``, ``--subtensor.network``, ``--netuid``…);
environment names are those of the miner guide (``NETUID``, ``SUBTENSOR_NETWORK``…). Every option
below is documented, with its default, in ``.env.example`` (a test keeps the two in step).

A bad value raises :class:`SettingsError` naming the setting and where the value came from.
"""

from quasar.config.cli import (
    add_arguments,
    env_example,
    parse_args,
    role_options,
    seq_lens_type,
    settings_help,
    settings_table,
)
from quasar.config.options import (
    DEFAULT_SEQ_LENS,
    GROUPS,
    OPTIONS,
    OPTIONS_BY_KEY,
    REFERENCE_MODEL_ID,
    ROLES,
    Option,
)
from quasar.config.settings import (
    DOTENV_VARIABLE,
    LIBRARY_VARIABLES,
    PROJECT_ROOT,
    Settings,
    SettingsError,
    default_dotenv_path,
    named_setting,
    resolve,
    settings_keys,
)
from quasar.config.values import BITTENSOR_NETWORKS, DEV_NETWORK, NETWORKS

__all__ = [
    "BITTENSOR_NETWORKS",
    "DEFAULT_SEQ_LENS",
    "DEV_NETWORK",
    "DOTENV_VARIABLE",
    "GROUPS",
    "LIBRARY_VARIABLES",
    "NETWORKS",
    "OPTIONS",
    "OPTIONS_BY_KEY",
    "PROJECT_ROOT",
    "REFERENCE_MODEL_ID",
    "ROLES",
    "Option",
    "Settings",
    "SettingsError",
    "add_arguments",
    "default_dotenv_path",
    "env_example",
    "named_setting",
    "parse_args",
    "resolve",
    "role_options",
    "seq_lens_type",
    "settings_help",
    "settings_table",
    "settings_keys",
]
