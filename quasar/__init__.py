"""The QUASAR core: shared by the miner, the validator, the submission API and the scripts."""

__version__ = "0.1.0"


def version_key() -> int:
    """The integer version published with weights on chain: major*10000 + minor*100 + patch."""
    major, minor, patch = (int(part) for part in __version__.split("."))
    return major * 10_000 + minor * 100 + patch
