"""The tools miners and validators run by hand on their own machine, each a ``quasar`` command:
``install_kernel`` (``quasar step1``), ``tune_kernel`` (``quasar step2``), ``local_validator``
(``quasar local-validator``) and ``check_sandbox`` (``quasar check-sandbox``). Their refusals are
wrapped to the terminal (:class:`quasar.terminal.WrappingParser`)."""
