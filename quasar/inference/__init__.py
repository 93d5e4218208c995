"""The miner inference server and the validator's client for logit verification (docs/rules.md §4 step 6).

- :mod:`quasar.inference.server`: ``create_inference_app`` (FastAPI), run by
  ``quasar inference serve`` (:mod:`quasar.inference.cli`) / ``./START_MINER_INFERENCE.sh``;
- :mod:`quasar.inference.client`: ``verify_miner_logits``, what a validator calls per miner.

The model, challenges and the comparison live in :mod:`quasar.logits`.
"""
