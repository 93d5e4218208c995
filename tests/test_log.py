"""Logging never prints a configured secret."""

import io
import logging

from quasar.log import setup_logging


def test_secret_values_are_masked_in_log_output():
    stream = io.StringIO()
    setup_logging(debug=False, secrets=["tok_12345"], stream=stream)
    logging.getLogger("quasar.test").info("pushing with token %s to %s", "tok_12345", "origin")
    output = stream.getvalue()
    assert "tok_12345" not in output
    assert "pushing with token *** to origin" in output
