"""Settings for the whole suite, applied before any test module imports torch.

One OpenMP thread per process, unless the caller set OMP_NUM_THREADS: the suite runs many torch
processes at once (evaluations side by side, the local network's neurons, sandboxed children,
which inherit it through the sandbox's passed variables). With torch's default of one thread per
core, their threads outnumber the cores and each parallel region waits for a descheduled thread:
on two cores, beside two busy processes, a T=64 forward of the starter fork took 3 to 19 s
instead of 0.03 to 0.1 s with one thread.
"""

import os
import sys
import threading

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

# The submission API's fixtures (wallets, a dev chain, PostgreSQL, a database on each backend, a
# started API), for every test file that names them as arguments.
pytest_plugins = ["api_fixtures"]


@pytest.fixture(autouse=True)
def uncaught_exception_hooks():
    """Each test leaves Python's hooks for uncaught exceptions as it found them: quasar.log's
    setup_logging, which some tests call in pytest's process, replaces them, and pytest's own hook
    for threads (it warns of a test's thread that raised) was gone for every later test."""
    hooks = sys.excepthook, threading.excepthook
    yield
    sys.excepthook, threading.excepthook = hooks
