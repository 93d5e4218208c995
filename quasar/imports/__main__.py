"""``python -m quasar.imports``: see :mod:`quasar.imports.cli`."""

import sys

from quasar.imports.cli import main

if __name__ == "__main__":
    sys.exit(main())
