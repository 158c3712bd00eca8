"""Every `swarmrl` command and its parameters, read from the typer app itself, so a
command added later is covered without touching the harness."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import typer
import typer.main


@dataclass(frozen=True)
class Param:
    """One parameter of a command, in the terms the bad-input matrix needs."""

    name: str  # the Python name, e.g. "max_tokens"
    flag: str | None  # the long option ("--max-tokens"); None for a positional argument
    kind: str  # "path", "int", "float", "str", "choice" or "bool"
    required: bool
    minimum: float | None
    maximum: float | None
    multiple: bool

    @property
    def shown(self) -> str:
        return self.flag or self.name.upper()


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]  # ("tasks", "filter")
    params: tuple[Param, ...]

    @property
    def shown(self) -> str:
        return " ".join(self.path)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


_KINDS = {Path: "path", int: "int", float: "float", str: "str", bool: "bool"}


def _kind(annotation: object) -> tuple[str, bool]:
    """The matrix kind of a typer annotation, and whether it is a list."""
    origin = typing.get_origin(annotation)
    if origin is list:
        (item,) = typing.get_args(annotation)
        return _kind(item)[0], True
    if origin in (typing.Union, types.UnionType):
        (item,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _kind(item)
    if origin is typing.Literal or (isinstance(annotation, type) and issubclass(annotation, Enum)):
        return "choice", False
    if annotation not in _KINDS:
        raise TypeError(f"the CLI contract has no bad inputs for parameters of type {annotation}")
    return _KINDS[annotation], False


def _param(click_param: object) -> Param:
    kind, is_list = _kind(click_param.type_descriptor.annotation)
    long_opts = [o for o in click_param.opts if o.startswith("--")]
    is_option = isinstance(click_param, typer.core.TyperOption)
    return Param(
        name=click_param.name,
        flag=long_opts[0] if is_option else None,
        kind=kind,
        required=bool(click_param.required),
        minimum=click_param.min,
        maximum=click_param.max,
        multiple=bool(click_param.multiple) or is_list,
    )


def discover(app: typer.Typer) -> list[Command]:
    """Every leaf command of ``app`` with its parameters, in the app's order."""
    found: list[Command] = []

    def walk(command: object, path: tuple[str, ...]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is not None:
            for name, sub in subcommands.items():
                walk(sub, (*path, name))
            return
        params = tuple(_param(p) for p in command.params)
        found.append(Command(path=path, params=params))

    walk(typer.main.get_command(app), ())
    return found
