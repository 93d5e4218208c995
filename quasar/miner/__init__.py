"""The QUASAR miner: fork, optimize, benchmark, commit and push, submit.

- github.py: the fork through GitHub's REST API; git with the token given per command;
- workspace.py: one folder per hotkey (lock, clone, state, reports);
- strategies/: what proposes candidate edits (tuning of ``tuning.json``, a language-model agent);
- loop.py: the optimization loop (evaluate, keep or roll back, commit, push, submit);
- submission.py: direct and commit-reveal submissions, the target length and the claim;
- state.py: what survives a restart, written atomically;
- runner.py: building all of it from settings;
- cli.py: the commands ``quasar miner`` (``python -m neurons.miner``) and ``quasar status``.
"""
