"""The neurons' older spellings, ``python -m neurons.miner`` and ``python -m neurons.validator``:
the same as ``quasar miner`` and ``quasar validator`` (:mod:`quasar.cli`)."""
