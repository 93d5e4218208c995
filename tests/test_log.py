"""Logging never prints a configured secret, nor anything that drives the terminal it is read in."""

import http.server
import io
import json
import logging
import os
import pty
import re
import subprocess
import sys
import threading

import httpx
import pytest

from quasar.api.client import ApiClient, ApiClientError
from quasar.log import Repeats, setup_logging


def test_secret_values_are_masked_in_log_output():
    stream = io.StringIO()
    setup_logging(debug=False, secrets=["tok_12345"], stream=stream)
    logging.getLogger("quasar.test").info("pushing with token %s to %s", "tok_12345", "origin")
    output = stream.getvalue()
    assert "tok_12345" not in output
    assert "pushing with token *** to origin" in output


def test_http_requests_are_logged_only_when_debugging():
    """httpx logs every request at INFO; a validator polling the API would print one line a second."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    server.RequestHandlerClass.log_message = lambda *args: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        for debug in (False, True):
            stream = io.StringIO()
            setup_logging(debug=debug, stream=stream)
            httpx.get(url)
            assert ("HTTP Request: GET" in stream.getvalue()) == debug, stream.getvalue()
    finally:
        server.shutdown()
        setup_logging(stream=io.StringIO())


# What a hostile peer puts in its words: set the terminal's title, clear the screen, move to the
# start of the line and overwrite it, reverse the text that follows.
TERMINAL_ATTACK = "\x1b]0;pwned\x07\x1b[2J\rverdict PASS \u202eevil\x9b"


def test_attack_a_peers_words_cannot_drive_the_operators_terminal_through_the_log():
    """A submission API (taken over, or a fake one) answers a validator's request with a refusal
    whose detail carries terminal escapes; the validator logs the error. Any log line, in its
    message or its traceback, shows them as ``?``."""

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's name
            body = json.dumps({"detail": TERMINAL_ATTACK}).encode()
            self.send_response(503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stream = io.StringIO()
    setup_logging(stream=stream)
    logger = logging.getLogger("quasar.validator.test")
    try:
        with (
            ApiClient(f"http://127.0.0.1:{server.server_address[1]}") as client,
            pytest.raises(ApiClientError) as caught,
        ):
            client.health()
        logger.warning("the API refused: %s", caught.value)
        try:
            raise RuntimeError(TERMINAL_ATTACK)
        except RuntimeError:
            logger.exception("a step failed")
    finally:
        server.shutdown()
        setup_logging(stream=io.StringIO())
    output = stream.getvalue()
    assert "the API refused" in output and "a step failed" in output and "RuntimeError" in output
    for control in ("\x1b", "\x07", "\r", "\u202e", "\x9b"):
        assert control not in output, (control, output)
    assert "?]0;pwned??[2J?verdict PASS ?evil?" in output


def run_logging_process(code: str, terminal: bool) -> str:
    """What a process that calls ``setup_logging(secrets=["tok_12345"])`` and then runs ``code``
    writes, on a pseudo-terminal (rich's handler) or a pipe (pm2's logs)."""
    program = f"from quasar.log import setup_logging\nsetup_logging(secrets=['tok_12345'])\n{code}"
    if not terminal:
        done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
        return done.stderr
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"}
    with subprocess.Popen([sys.executable, "-c", program], stdout=follower, stderr=follower, env=env) as process:
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the process ended and closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        process.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_attack_an_exceptions_words_reach_a_terminal_only_made_safe():
    """Rich's tracebacks, on a terminal, wrote an exception's message as it was: the token a failed
    push's URL carried, and a peer's terminal controls (the escape reached the terminal raw)."""
    code = (
        "import logging\n"
        "try:\n"
        "    raise RuntimeError('https://x:' + 'tok_' + '12345@github.com \\x1b]0;pwned\\x07')\n"
        "except RuntimeError:\n"
        "    logging.getLogger('quasar.test').exception('the push failed')\n"
    )
    output = run_logging_process(code, terminal=True)
    shown = re.sub("\x1b\\[[0-9;]*m", "", output)  # the text, without rich's colours
    assert "the push failed" in shown and "RuntimeError" in shown, shown
    assert "tok_12345" not in shown and "https://x:***@github.com" in shown, shown
    # Rich colours with CSI sequences (ESC [); any other escape, and any BEL, came from the message.
    assert re.search("\x1b(?!\\[)", output) is None and "\x07" not in output, repr(output)


@pytest.mark.parametrize("where", ["main", "thread"])
def test_an_uncaught_exception_is_logged_masked_and_timestamped(where):
    """An exception no code catches was printed by Python itself: the secret its message carried
    reached pm2's logs, on lines with no time."""
    crash = "raise RuntimeError('push to https://x:' + 'tok_' + '12345@github.com failed')"
    code = crash if where == "main" else f"import threading\nthreading.Thread(target=lambda: exec({crash!r})).start()"
    output = run_logging_process(code, terminal=False)
    assert "tok_12345" not in output and "push to https://x:***@github.com failed" in output, output
    header = re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ CRITICAL .*uncaught", output, re.MULTILINE)
    assert header is not None, output


def test_a_thread_ended_by_system_exit_ends_quietly():
    """``sys.exit()`` in a thread ends that thread, as Python's own hook has it, with nothing said:
    it was logged as an uncaught exception, CRITICAL with a traceback, in every process that set
    up logging (the raised SystemExit is an instance however it was raised)."""
    for exit_call in ("sys.exit", "sys.exit, args=(3,)"):
        code = f"import sys, threading\nthreading.Thread(target={exit_call}).start()\n"
        assert run_logging_process(code, terminal=False) == ""


def test_a_test_that_sets_up_logging_leaves_pytest_its_hook_for_threads(tmp_path):
    """setup_logging replaces Python's hooks for uncaught exceptions, and tests call it in pytest's
    own process: a test's thread that raised, in any later test of the session, was logged to that
    test's stream and gone, where pytest warns of it (PytestUnhandledThreadExceptionWarning)."""
    (tmp_path / "test_inner.py").write_text(
        "import io, threading\n"
        "from quasar.log import setup_logging\n"
        "def test_sets_up_logging():\n"
        "    setup_logging(stream=io.StringIO())\n"
        "def test_leaves_a_thread_raising():\n"
        "    thread = threading.Thread(target=lambda: 1 / 0)\n"
        "    thread.start()\n"
        "    thread.join()\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "--rootdir", tmp_path]
        + [tmp_path / "test_inner.py"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.path.dirname(__file__)},
    )
    assert "2 passed" in done.stdout, done.stdout + done.stderr
    assert "PytestUnhandledThreadExceptionWarning" in done.stdout and "ZeroDivisionError" in done.stdout, done.stdout


def test_a_repeated_condition_is_said_again_when_its_text_changes_and_after_it_ended(caplog):
    """Repeats: the same text within every_s is counted, not said; a new text is said at once; an
    ended condition that comes back is said at once, in full."""
    now = [0.0]
    repeats = Repeats(logging.getLogger("quasar.test"), every_s=600.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="quasar.test")
    for text in ("API down: refused", "API down: refused", "API down: timed out", "API down: timed out"):
        repeats.say("fetch", logging.ERROR, text)
        now[0] += 12.0
    repeats.ended("fetch", "fetch works again")
    repeats.ended("fetch", "fetch works again")
    repeats.say("fetch", logging.ERROR, "API down: timed out")
    assert [record.getMessage() for record in caplog.records] == [
        "API down: refused",
        "API down: timed out",
        "fetch works again",
        "API down: timed out",
    ]


def test_a_condition_whose_text_changes_only_in_measured_figures_is_not_said_again(caplog):
    """A clock off: each refusal says the offset measured (120.0 s, 120.2 s) and the receiver's time,
    which differ at each step; the condition is the same, counted, not said. An integer (a status,
    an id) that changes is a new text."""
    now = [0.0]
    repeats = Repeats(logging.getLogger("quasar.test"), every_s=600.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="quasar.test")
    for offset, at, status in ((120.0, "08:47:58", 401), (120.2, "08:48:10", 401), (119.9, "08:48:22", 503)):
        repeats.say("fetch", logging.ERROR, f"{status}: signed {offset} s ahead of this server's clock ({at} UTC)")
        now[0] += 12.0
    assert [record.getMessage() for record in caplog.records] == [
        "401: signed 120.0 s ahead of this server's clock (08:47:58 UTC)",
        "503: signed 119.9 s ahead of this server's clock (08:48:22 UTC)",
    ]


def test_a_condition_whose_address_or_version_changes_is_said_again(caplog):
    """An address (10.0.0.1 to 10.0.0.2: the subnet owner moved the API) or a version (2.4.1 to
    2.5.1) is not a measured figure: Repeats read each as two decimals and counted a validator
    failing on a new host as the same condition, unsaid for ten minutes."""
    now = [0.0]
    repeats = Repeats(logging.getLogger("quasar.test"), every_s=600.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="quasar.test")
    texts = (
        "cannot reach http://10.0.0.1:9000: refused",
        "cannot reach http://10.0.0.2:9000: refused",
        "the API needs QUASAR 2.4.1",
        "the API needs QUASAR 2.5.1",
        "the API needs QUASAR 2.5.1 (took 1.5 s)",
        "the API needs QUASAR 2.5.1 (took 2.5 s)",
    )
    for text in texts:
        repeats.say("fetch", logging.ERROR, text)
        now[0] += 12.0
    assert [record.getMessage() for record in caplog.records] == list(texts[:5])
