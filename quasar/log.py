"""Logging for QUASAR processes: standard ``logging``, a rich handler on terminals, secrets masked."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable

from rich.logging import RichHandler

REDACTED = "***"
# Libraries that log every request or block at INFO: WARNING and above only, unless debugging.
CHATTY_LIBRARIES = ("bittensor", "httpx", "httpcore", "urllib3", "websockets")


class RedactSecrets(logging.Filter):
    """Replace any known secret value in a record's final message with ``***``."""

    def __init__(self, secrets: Iterable[str]):
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            for secret in self.secrets:
                message = message.replace(secret, REDACTED)
            record.msg, record.args = message, None
        return True


def setup_logging(debug: bool = False, secrets: Iterable[str] = (), stream=None, quiet: bool = False) -> None:
    """Configure the root logger once per process; every ``quasar`` command calls it first.

    Terminals get rich's handler; pipes and files (pm2, systemd) get plain timestamped lines.
    ``secrets`` (``Settings.secrets()``) are masked in every record. The root logger logs INFO, or
    only warnings and errors when ``quiet`` (tools that print their own progress and results),
    and DEBUG with ``debug`` either way. The Bittensor SDK and the HTTP clients
    (:data:`CHATTY_LIBRARIES`) stay at WARNING unless ``debug``.
    """
    stream = stream or sys.stderr
    if stream.isatty():
        handler: logging.Handler = RichHandler(rich_tracebacks=True, show_path=debug)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(RedactSecrets(secrets))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO)
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.DEBUG if debug else logging.WARNING)
