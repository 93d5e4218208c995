"""Logging for QUASAR processes: standard ``logging``, a rich handler on terminals, secrets masked."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from rich.logging import RichHandler

from quasar.safe_text import without_terminal_controls

REDACTED = "***"
# Libraries that log every request or block at INFO: WARNING and above only, unless debugging.
CHATTY_LIBRARIES = ("bittensor", "httpx", "httpcore", "urllib3", "websockets")
# How often a condition met at every step (an API out of reach) is said again while it lasts.
REPEAT_EVERY_S = 600.0
# What a repeated condition's text may change in and stay the same condition: measured figures (decimals: a
# clock's offset, a duration) and times of day, which differ at each step; ids and status codes are integers,
# and an address or a version (10.0.0.2, 2.5.1: more than one dot) names something else.
_MEASURED = re.compile(r"(?<!\d\.)(?<!\d)\d+\.\d+(?!\.?\d)|\d\d:\d\d:\d\d")


class SafeText:
    """What a log may show of a text: every known secret value replaced by ``***``, and the
    characters that drive a terminal (escape sequences, carriage returns, direction overrides:
    :mod:`quasar.safe_text`) by ``?``. A miner's, a validator's, an API's or a fork's words reach
    the logs, and pm2's logs are read in terminals."""

    def __init__(self, secrets: Iterable[str]):
        self.secrets = [s for s in secrets if s]

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return without_terminal_controls(text)


class SafeRecords(logging.Filter):
    """A record's final message made :class:`SafeText` (newlines stay: callers keep a peer's
    words on one line where a line must not be forged)."""

    def __init__(self, safe: SafeText):
        super().__init__()
        self.safe = safe

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.safe(record.getMessage()), None
        return True


class SafeFormatter(logging.Formatter):
    """A formatter whose tracebacks and stacks are made :class:`SafeText` too (an exception's
    message may carry a peer's words or a secret)."""

    def __init__(self, fmt: str, safe: SafeText):
        super().__init__(fmt)
        self.safe = safe

    def formatException(self, ei) -> str:  # logging's name
        return self.safe(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # logging's name
        return self.safe(super().formatStack(stack_info))


# Records logged before setup_logging, which needs the settings (the debug flag, the secrets) and so
# comes after they are read: held and logged once it has run, with its time and masking, rather than
# written bare by logging's last resort (one unmasked line as wide as its text, on a terminal too).
_held: list[logging.LogRecord] = []


def log_when_set_up(logger: logging.Logger, level: int, msg: str, *args: object) -> None:
    """Log ``msg % args`` through ``logger`` now where a handler would take it (logging is set up),
    else hold it for :func:`setup_logging` to log."""
    if logger.hasHandlers():
        logger.log(level, msg, *args, stacklevel=2)
    elif logger.isEnabledFor(level):
        path, line, function, _ = logger.findCaller(stacklevel=2)
        _held.append(logger.makeRecord(logger.name, level, path, line, msg, args, None, function))


def setup_logging(debug: bool = False, secrets: Iterable[str] = (), stream=None, quiet: bool = False) -> None:
    """Configure the root logger once per process; every ``quasar`` command calls it first.

    Terminals get rich's handler; pipes and files (pm2, systemd) get plain timestamped lines.
    ``secrets`` (``Settings.secrets()``) are masked in every record, and terminal controls in
    it shown as ``?`` (:class:`SafeText`), tracebacks included: rich's own tracebacks are off,
    as they write an exception's message as it is. An exception no code catches, in any thread,
    is logged too (CRITICAL), rather than printed by Python unmasked and without a time. The root
    logger logs INFO, or only warnings and errors when ``quiet`` (tools that print their own
    progress and results), and DEBUG with ``debug`` either way. The Bittensor SDK and the HTTP
    clients (:data:`CHATTY_LIBRARIES`) stay at WARNING unless ``debug``. Records held by
    :func:`log_when_set_up` are logged then.
    """
    stream = stream or sys.stderr
    safe = SafeText(secrets)
    if stream.isatty():
        handler: logging.Handler = RichHandler(show_path=debug)
        handler.setFormatter(SafeFormatter("%(name)s: %(message)s", safe))
    else:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", safe))
    handler.addFilter(SafeRecords(safe))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO)
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(logging.DEBUG if debug else logging.WARNING)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread
    held, _held[:] = list(_held), []
    for record in held:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


def _log_uncaught(kind: type[BaseException], error: BaseException, traceback) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, error, traceback)
        return
    logging.getLogger("quasar").critical("uncaught exception", exc_info=(kind, error, traceback))


def _log_uncaught_in_thread(hook: threading.ExceptHookArgs) -> None:
    error = hook.exc_value
    if error is None or isinstance(error, SystemExit):  # SystemExit ends its thread quietly, as in Python's hook
        return
    thread = hook.thread.name if hook.thread is not None else "a thread"
    logging.getLogger("quasar").critical("uncaught exception in %s", thread, exc_info=error)


@contextmanager
def library_progress_bars(shown: bool) -> Iterator[None]:
    """transformers' and huggingface_hub's progress bars (loading, saving, downloading a model)
    drawn or not within the block, and as they were after it. A bar redraws its line with carriage
    returns: on a terminal one line, in a log file (pm2) a line that grows at every update."""
    from transformers.utils import logging as hf_logging

    were_shown = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if shown else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if were_shown else hf_logging.disable_progress_bar)()


class Repeats:
    """Conditions a loop meets at every step (an API or a chain out of reach, a phase failing the
    same way), each said in full the first time and whenever its text changes other than in measured
    figures and times of day (a clock's offset, the receiver's time: a clock off), then again at
    most every ``every_s`` with how often it recurred meanwhile, and once when it ends. pm2 keeps
    every line: a validator's traceback at each 12 s step of an API outage wrote 8 MB a day. The
    default clock is monotonic, so that a step of the wall clock moves no reminder."""

    def __init__(
        self, logger: logging.Logger, every_s: float = REPEAT_EVERY_S, clock: Callable[[], float] = time.monotonic
    ):
        self.logger = logger
        self.every_s = every_s
        self.clock = clock
        self._said: dict[str, tuple[str, float, int]] = {}  # key -> (text, when said, times met since)

    def say(self, key: str, level: int, text: str, exc_info: BaseException | None = None) -> None:
        """``key``'s condition is met now, described by ``text`` (with ``exc_info``'s traceback
        the first time it is said)."""
        now = self.clock()
        said = self._said.get(key)
        if said is None or _MEASURED.sub("#", said[0]) != _MEASURED.sub("#", text):
            self.logger.log(level, "%s", text, exc_info=exc_info)
            self._said[key] = (text, now, 0)
        elif now - said[1] >= self.every_s:
            self.logger.log(level, "%s (%d more time(s) in the last %.0f s)", text, said[2] + 1, now - said[1])
            self._said[key] = (text, now, 0)
        else:
            self._said[key] = (text, said[1], said[2] + 1)

    def ended(self, key: str, text: str | None = None) -> None:
        """``key``'s condition no longer holds: say ``text`` (INFO), if given, when it had been said."""
        if self._said.pop(key, None) is not None and text is not None:
            self.logger.info("%s", text)


class Tally:
    """Events too many for a line each under pm2, counted instead: each logged at DEBUG, and at
    INFO, at the first event ``every_s`` or more after the last count was said, one line counting
    those since by kind and by who caused them. The API's report lines grow with every validator's
    GPUs (about 80 reports an hour each): 64 validators of 8 would write 130 MB a day."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        every_s: float = REPEAT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.logger = logger
        self.what = what
        self.every_s = every_s
        self.clock = clock
        self._lock = threading.Lock()  # the API's handlers run in threads
        self._since = clock()
        self._kinds: Counter[str] = Counter()
        self._who: set[str] = set()

    def add(self, kind: str, who: str, text: str) -> None:
        """Count one event of ``kind`` caused by ``who`` (a hotkey), described by ``text`` (DEBUG)."""
        self.logger.debug("%s", text)
        with self._lock:
            self._kinds[kind] += 1
            self._who.add(who)
            now = self.clock()
            if now - self._since < self.every_s:
                return
            kinds = ", ".join(f"{count:,} {name}" for name, count in self._kinds.most_common())
            said = f"{self.what} in the last {now - self._since:.0f} s: {kinds}, from {len(self._who):,} hotkey(s)"
            self._since, self._kinds, self._who = now, Counter(), set()
        self.logger.info("%s", said)
