"""The QUASAR submission API: miners submit (directly or by commit-reveal), validators fetch work and
report measured results, and a per-round leaderboard ranks the validators' figures.

Run it with ``python -m quasar.api serve`` (or ``./START_SERVER.sh``); build it in code with
:func:`quasar.api.app.create_app`; talk to it with :class:`quasar.api.client.ApiClient`.
"""
