"""Commands that installed packages add to ``dbcluster`` through the ``dbcluster.commands``
entry-point group (docs/cli.md, "Adding a command"); dbcluster's own ``chaos`` and ``bench``
come this way too, so the CLI imports neither.

The group is read when a command is looked up or listed, never when the CLI starts, and a
command's module is imported only when that command is run or help lists it. A command that
cannot be loaded (its module is gone or fails to import, or the entry point names something
that is not a click command) stays listed and, when run, says so in one line (exit 2).
"""

from __future__ import annotations

import functools
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points
from typing import Any

import click

from dbcluster.errors import ConfigurationError

ENTRY_POINT_GROUP = "dbcluster.commands"


@functools.cache
def registered() -> dict[str, EntryPoint]:
    """The installed packages' commands by name (the first one wins where two share a name).
    Read once per process: scanning the installed packages is slow, and they do not change."""
    found: dict[str, EntryPoint] = {}
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry_point.name, entry_point)
    return found


def load(entry_point: EntryPoint) -> click.Command:
    """The command an entry point names, or one that says in a line why it cannot be loaded."""
    try:
        command = entry_point.load()
    except Exception as exc:  # noqa: BLE001 - any failure of a plugin's import is reported
        return Unloadable(entry_point, f"{type(exc).__name__}: {_first_line(exc)}")
    if not isinstance(command, click.Command):
        return Unloadable(entry_point, f"{entry_point.value} is not a click command")
    return command


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else "(no message)"


def _owner(entry_point: EntryPoint) -> str:
    dist = getattr(entry_point, "dist", None)
    return f"package {dist.name}" if dist is not None else "its package"


class Unloadable(click.Command):
    """Stands in for a registered command that could not be loaded: help lists it with the
    reason; running it (with any arguments, ``--help`` too) fails with that reason in one line."""

    def __init__(self, entry_point: EntryPoint, reason: str) -> None:
        self.reason = (
            f"the command {entry_point.name!r} ({entry_point.value}, registered by "
            f"{_owner(entry_point)} in the {ENTRY_POINT_GROUP} entry points) cannot be loaded: "
            f"{reason}; reinstall or uninstall that package"
        )
        super().__init__(
            entry_point.name,
            callback=self._fail,
            help=f"Cannot be loaded: {reason}",
            add_help_option=False,
            context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        )

    def _fail(self) -> None:
        raise ConfigurationError(self.reason)


def missing_hint() -> str | None:
    """Why a command dbcluster ships through its entry points may be unknown: the installed
    metadata predates them (an editable install made before they existed), or dbcluster runs
    from a source tree without being installed."""
    try:
        own = distribution("dbcluster").entry_points.select(group=ENTRY_POINT_GROUP)
    except PackageNotFoundError:
        return "dbcluster is not installed, so no command it registers is known (pip install -e .)"
    if not own:
        return (
            f"dbcluster's installed metadata lists no {ENTRY_POINT_GROUP} entry points (an "
            "install older than its code?): reinstall dbcluster"
        )
    return None


class CommandGroup(click.Group):
    """A click group whose commands are its own plus the registered ones; its own win a name
    both use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(registered()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = self.commands.get(cmd_name)
        if command is None and cmd_name in registered():
            command = load(registered()[cmd_name])
            self.commands[cmd_name] = command
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            unknown = bool(args) and self.get_command(ctx, args[0]) is None
            hint = missing_hint() if unknown else None
            if hint is None:
                raise
            raise click.UsageError(f"{exc.message} ({hint})", exc.ctx) from None


def group(**attrs: Any) -> Any:
    """``click.group`` making a :class:`CommandGroup`."""
    return click.group(cls=CommandGroup, **attrs)
