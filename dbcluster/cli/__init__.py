"""The ``dbcluster`` command (docs/cli.md): :func:`main` runs it, :data:`cli` is its click group.

A package of commands over the engine, imported by nothing in the product: ``main`` holds the
group and the exit statuses, ``engines`` opens every command's database, ``options`` the options
they share, and one module per family of commands (``tables``: ddl, init; ``run``: worker,
launch, restart; ``inspect``: status, jobs, job; ``dashboard``: web; ``stop``; ``submit``:
submit, schedules; ``prune``; ``migrate``; ``demo``). Other packages add commands through the
``dbcluster.commands`` entry points (``plugins``).
"""

from dbcluster.cli.main import cli, main

__all__ = ["cli", "main"]
