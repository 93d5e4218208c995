"""The local network: a whole QUASAR subnet on one machine (``quasar localnet``,
``./START_LOCALNET.sh``).

network.py builds and runs it (dev chain, submission API, wallets, forks, inference servers, the
validator neuron) and reads the round's outcome; forks.py writes the honest and hostile forks;
github_standin.py serves them as GitHub would (also to the miner's tests); model.py the offline
stand-in reference model; processes.py starts, watches and stops the children; summary.py turns
a round into JSON and tables; cli.py is the command. Nothing is imported here, so
``quasar localnet --help`` answers before torch loads.
"""
