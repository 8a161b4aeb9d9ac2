"""The machinery behind declared options: `option(...)` declares one field of an option set
(its default, help text, command-line flags, choices, environment variable and check), and
`OptionSet` turns a dataclass of them into argparse arguments and validates its values, so
the command line and the Python API read the same declarations. The sets are in `args.py`
(the engine's) and `cli_args.py` (the command line's other groups)."""

from __future__ import annotations

import argparse
import math
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, Field, field, fields
from typing import Any, ClassVar

from xinfer.errors import UserError

# A check gets the value (never None) and raises UserError, or returns a message (a failure).
Check = Callable[[Any], "str | None"]


def option(
    default: Any,
    help: str,
    *,
    flags: tuple[str, ...] = (),
    choices: tuple[Any, ...] | None = None,
    env: Callable[[], Any] | None = None,
    check: Check | None = None,
    metavar: str | None = None,
    cli: bool = True,
) -> Any:
    """One option. `flags`: its command-line spellings (default `--field-name`); `env`: the
    `envs.py` reader consulted when the value is None (a flag given wins over it); `check`:
    validation beyond type and choices; `cli=False`: Python API only."""
    meta = {
        "help": help,
        "flags": flags,
        "choices": choices,
        "env": env,
        "check": check,
        "metavar": metavar,
        "cli": cli,
    }
    return field(default=default, metadata=meta)


def at_least(low: float) -> Check:
    return lambda v: None if v >= low else f"must be >= {low}"


def above(low: float) -> Check:
    return lambda v: None if v > low else f"must be > {low}"


def within(low: float, high: float) -> Check:
    return lambda v: None if low <= v <= high else f"must be in [{low}, {high}]"


def _plain_types(hint: Any) -> tuple[type, ...]:
    """The non-None classes of `X | Y | None` (`list[str]` → `list`)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hints = tuple(t for t in typing.get_args(hint) if t is not type(None))
    else:
        hints = (hint,)
    return tuple(typing.get_origin(t) or t for t in hints)


def _type_name(t: type) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    return names.get(t, t.__name__)


def _matches(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    if isinstance(value, float) and not math.isfinite(value):  # nan, inf: no option's value
        return False
    return isinstance(value, kinds)


class OptionSet:
    """Base of the option dataclasses: validation in `__post_init__`, argparse glue."""

    GROUP: ClassVar[str] = "options"

    @classmethod
    def options(cls) -> list[tuple[Field, tuple[type, ...]]]:
        hints = typing.get_type_hints(cls)
        return [(f, _plain_types(hints[f.name])) for f in fields(cls) if "help" in f.metadata]

    @classmethod
    def flag(cls, name: str) -> str:
        f = next(f for f in fields(cls) if f.name == name)
        return (f.metadata["flags"] or ("--" + name.replace("_", "-"),))[0]

    def __post_init__(self) -> None:
        for f, kinds in self.options():
            value = getattr(self, f.name)
            if value is None:
                continue
            where = self.flag(f.name) if f.metadata["cli"] else f.name
            if not _matches(value, kinds):
                wanted = " or ".join(_type_name(t) for t in kinds)
                raise UserError(f"{where} must be {wanted}, got {value!r}")
            choices = f.metadata["choices"]
            if choices is not None and value not in choices:
                raise UserError(
                    f"{where} must be one of {', '.join(map(str, choices))}, got {value!r}"
                )
            check = f.metadata["check"]
            problem = check(value) if check is not None else None
            if problem:
                raise UserError(f"{where} {problem}, got {value!r}")

    def changed(self) -> list[str]:
        """The flags of the command-line options set to other than their defaults."""
        return [
            self.flag(f.name)
            for f, _ in self.options()
            if f.metadata["cli"] and getattr(self, f.name) != f.default
        ]

    def value(self, name: str) -> Any:
        """The option's value; when unset (None), its environment variable's, if it has one."""
        value = getattr(self, name)
        env = next(f for f in fields(self) if f.name == name).metadata.get("env")
        return env() if value is None and env is not None else value

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group(cls.GROUP)
        for f, kinds in cls.options():
            meta = f.metadata
            if not meta["cli"]:
                continue
            default = None if f.default is MISSING else f.default
            help_text = meta["help"]
            if meta["env"] is not None:
                help_text += f" (env {meta['env'].__name__}; the flag wins)"
            kw: dict[str, Any] = {"dest": f.name, "default": default, "help": help_text}
            if kinds == (list,):
                kw.update(action="append", metavar=meta["metavar"] or "TEXT")
            elif kinds == (bool,):
                # store_true for off-by-default switches; --x/--no-x when the default is on
                # or "unset" (None: decided later, e.g. by the environment or the device).
                kw["action"] = "store_true" if default is False else argparse.BooleanOptionalAction
            else:
                kind = kinds[0] if len(kinds) == 1 and kinds[0] in (int, float) else str
                metavar = meta["metavar"] or {int: "N", float: "X"}.get(kind, "TEXT")
                kw.update(type=kind, metavar=None if meta["choices"] else metavar)
                if meta["choices"] is not None:
                    kw["choices"] = meta["choices"]
            if kw.get("action") is argparse.BooleanOptionalAction:
                if meta["env"] is None:
                    kw["help"] += f" (default: {_default_text(default)})"
            elif default not in (None, False):
                kw["help"] += f" (default: {default})"
            action = group.add_argument(*(meta["flags"] or (cls.flag(f.name),)), **kw)
            action.help = kw["help"]  # Python 3.10's BooleanOptionalAction appends its own

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> OptionSet:
        return cls(**{f.name: getattr(ns, f.name) for f, _ in cls.options() if f.metadata["cli"]})


def _default_text(default: Any) -> str:
    return "auto" if default is None else ("on" if default else "off")
