"""For pip older than 21.3, which cannot install a pyproject-only project in editable mode.

Everything (name, version, dependencies, entry points) is declared in pyproject.toml.
"""

from setuptools import setup

setup()
