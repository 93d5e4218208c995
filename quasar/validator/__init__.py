"""The QUASAR validator: its loop (loop.py), its own state database (state.py), evaluations in
worker processes (evaluator.py, worker.py), logit checks (logit_check.py), verdicts and weights
from its own results (results.py), its devices (devices.py) and the checks before it starts
(preflight.py).

``quasar validator`` (cli.py; also ``python -m neurons.validator``) builds these from the
settings and runs ``Validator.run_forever``. Nothing is imported here, so ``python -m
quasar.validator.worker`` starts without torch until it needs it.
"""
