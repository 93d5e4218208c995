"""quasar/evaluate/oom_preference.py against real processes: the out-of-memory preference each one
holds, read from /proc as the memory watchdog reads it."""

from __future__ import annotations

import os
import subprocess
import sys

from quasar.evaluate.oom_preference import OOM_SCORE_ADJ, lowered_oom_preference


def test_a_process_of_the_uid_below_the_sandboxs_preference_is_found_and_others_are_not():
    """A process at the sandbox's 1000 is not reported; written down to 500 (which any process may,
    down to where it started without CAP_SYS_RESOURCE), it is, with its value; a process of another
    uid, or one gone, never is."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        adjust = f"/proc/{sleeper.pid}/oom_score_adj"
        with open(adjust, "w") as raised:
            raised.write(str(OOM_SCORE_ADJ))
        assert lowered_oom_preference([sleeper.pid], os.getuid()) is None
        with open(adjust, "w") as lowered:
            lowered.write("500")
        assert lowered_oom_preference([sleeper.pid], os.getuid()) == (sleeper.pid, 500)
        assert lowered_oom_preference([sleeper.pid], os.getuid() + 1) is None
    finally:
        sleeper.kill()
        sleeper.wait()
    assert lowered_oom_preference([sleeper.pid], os.getuid()) is None
