"""`python -m kwire`: the same as the `kwire` command."""

from kwire.cli import entry

entry()
