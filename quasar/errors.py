"""The root of the errors QUASAR raises to its callers.

Every error a module of the package raises for a caller to handle derives from
:class:`QuasarError` (most also from the built-in kind they always were, ``ValueError`` for bad
input, ``RuntimeError`` for a failed operation), so ``except QuasarError`` catches what the suite
means and nothing else. The exceptions are the modules the sandboxed child loads by file path
(``evaluate/protocol.py``, ``child.py``, ``sandbox_init.py``, ``syscall_filter.py``) and
``evaluate/ops_stand_in.py``, written into the fork's copy: they import nothing of the package, so
their errors derive from the built-in ones only.
"""


class QuasarError(Exception):
    """An error of the QUASAR suite; its message says what was wrong and, where it can, what to do."""
