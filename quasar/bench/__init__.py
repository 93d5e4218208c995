"""Measurements behind benchmarks/RESULTS.md, each a ``quasar bench`` command: ``harness``,
``kernel``, ``floor``, ``reference``, ``neighbours`` (the evaluation harness and the starter fork's
kernels on a GPU) and ``api_load``, ``api_profile`` (the submission API, ``quasar bench api-load``
and ``api-profile``; the load's client in ``api_load_traffic``, its figures in ``api_load_figures``),
``simulate_subnet`` (a whole subnet in compressed time), and ``api_month``, ``validator_month``
(the API's database and the validator's state file after many days, ``quasar bench api-month``
and ``validator-month``; their timed calls in ``month_timing``), ``dashboard_pages`` (the
dashboard over api-month's database, ``quasar bench dashboard-pages``), and ``inference`` (the
miner's inference server's requests at its limits against a validator's timeout, ``quasar bench
inference``)."""
