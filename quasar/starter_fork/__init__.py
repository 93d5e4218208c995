"""The project's starter fork of flash-linear-attention: a minimal fla tree with QuasarAttention
and correct Triton kernels (``tree/``), and the writer behind ``quasar starter-fork DIR``
(:mod:`quasar.starter_fork.cli`).

The tree is standalone: it never imports ``quasar`` (miners push it to GitHub as their fork).
"""

from quasar.starter_fork.writer import (
    AUTHOR_EMAIL,
    AUTHOR_NAME,
    KERNEL_DIR,
    LAYER_FILE,
    StarterForkError,
    commit_new_repository,
    copy_starter_tree,
    kernel_files,
    template_files,
    template_root,
    tuning_contract,
    write_starter_fork,
)

__all__ = [
    "AUTHOR_EMAIL",
    "AUTHOR_NAME",
    "KERNEL_DIR",
    "LAYER_FILE",
    "StarterForkError",
    "commit_new_repository",
    "copy_starter_tree",
    "kernel_files",
    "template_files",
    "template_root",
    "tuning_contract",
    "write_starter_fork",
]
