"""Measurements behind benchmarks/RESULTS.md, each a ``quasar bench`` command: ``harness``,
``kernel``, ``floor``, ``reference``, ``neighbours`` (the evaluation harness and the starter fork's
kernels on a GPU) and ``api_load``, ``api_profile`` (the submission API, ``quasar bench api-load``
and ``api-profile``; the load's client in ``api_load_traffic``, its figures in ``api_load_figures``)."""
