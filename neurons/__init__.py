"""Entry points of the two processes users run: ``python -m neurons.miner`` and ``python -m neurons.validator``."""
