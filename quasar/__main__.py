"""``python -m quasar COMMAND``: the same as the ``quasar`` command (:mod:`quasar.cli`)."""

import sys

from quasar.cli import main

if __name__ == "__main__":
    sys.exit(main())
