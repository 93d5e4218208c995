"""``python -m quasar.config``: print ``.env.example`` (every setting with its default and meaning)."""

from quasar.config.cli import env_example

print(env_example(), end="")
