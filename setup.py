"""Packaging for the QUASAR node suite; runtime dependencies come from requirements.txt."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent


def read_requirements(name: str) -> list[str]:
    lines = (HERE / name).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


setup(
    name="quasar-subnet",
    version="0.1.0",
    description="Miner, validator and submission API for QUASAR, the Bittensor subnet for fast QuasarAttention kernels",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["quasar", "quasar.*", "neurons"]),
    include_package_data=True,
    # The starter fork's template tree (not a package of ours: it is copied out verbatim).
    package_data={"quasar.config": ["settings.toml"],
                  "quasar.starter_fork": ["tree/**/*", "tree/.gitignore"],
                  "quasar.api": ["migrations/*.py", "migrations/*.mako", "migrations/versions/*.py", "templates/*.html"]},
    install_requires=read_requirements("requirements.txt"),
    extras_require={"test": read_requirements("requirements-test.txt")},
    entry_points={"console_scripts": ["quasar=quasar.cli:main"]},
)
