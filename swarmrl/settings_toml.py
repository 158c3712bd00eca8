"""Settings of the daemons: a TOML file and ``SWARMRL_*`` environment read into a
pydantic-settings model, every bad value one sentence naming its key and where it came
from, and the commented TOML template (and the markdown reference) generated from the
model's own fields, so that neither can drift from what the daemon accepts.

Precedence: the environment (``SWARMRL_<KEY>``, any case) over the file over the
defaults, but for the keys in LOCATION_KEYS, whose variables move their defaults only,
so the file's key wins. Relative paths in the file are relative to the file; in the
environment, relative to the working directory. Every settings file swarmrl writes
comes from ``write_settings``, which writes each path absolute, so that a path given
relative to the writer's working directory means the same folder when the file is
read back.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import textwrap
import tomllib
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, PrivateAttr, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from swarmrl.files import check_input_file, write_atomically

ENV_PREFIX = "SWARMRL_"
# A settings file is a few kilobytes; anything this large was given by mistake.
MAX_FILE_BYTES = 1024 * 1024
# Inputs quoted back in an error are cut here, so the sentence stays a sentence.
MAX_QUOTED_CHARS = 80
_TEMPLATE_WIDTH = 92
# Keys whose SWARMRL_<KEY> is a location variable, not the key's override: every swarmrl
# command reads it for where things live on this machine (swarmrl.files.data_dir), so a
# shell exports it for the wallet and chain commands too. Read as the key, it would
# silently override what a daemon's file sets with what was meant for those commands (and
# $SWARMRL_DATA_DIR, the folder that holds each daemon's own data_dir, would put a node and
# an orchestrator started from one shell into one folder). It moves the key's default
# only; the file's key wins. Key -> where its variable points, for the template's header.
LOCATION_KEYS: Mapping[str, str] = types.MappingProxyType(
    {
        "data_dir": "a folder holding one per daemon (node/, orchestrator/)",
        "keystore_dir": "the keystore folder of every command",
        "deployment": "the deployment file every command reads",
    }
)


class SettingError(ValueError):
    """A whole sentence about a bad setting, starting with the key (a validator raises it
    where "KEY must ..., got VALUE" would not say enough, e.g. a rule between several
    keys); the error names where the first of ``keys`` the user set came from."""

    def __init__(self, keys: tuple[str, ...], sentence: str) -> None:
        super().__init__(sentence)
        self.keys = keys


class SwarmrlSettings(BaseSettings):
    """What both daemons' settings share: the environment prefix, unknown keys refused,
    no infinities, paths with ``~`` expanded and never empty, no true/false for numbers."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        case_sensitive=False,
        extra="forbid",
        allow_inf_nan=False,
    )
    # Where the values came from (load_settings), so that a value refused later (a file
    # that is not there) is reported with the place to change it.
    _file: Path | None = PrivateAttr(None)
    _from_env: dict[str, str] = PrivateAttr(default_factory=dict)
    _from_file: frozenset[str] = PrivateAttr(frozenset())

    @property
    def file_keys(self) -> frozenset[str]:
        """The keys the settings file set (none without a file)."""
        return self._from_file

    def __eq__(self, other: object) -> bool:
        # The same values are the same settings, from a file or from the environment.
        return type(self) is type(other) and self.__dict__ == other.__dict__

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _Environment(settings_cls), dotenv_settings, file_secret_settings)

    def setting_error(self, key: str, error: object, remedy: str | None = None) -> ValueError:
        """One sentence about the value of ``key`` that a check after loading refused (a
        file that does not exist, a folder where a file belongs): the key, what is wrong
        (``error``), and where to change it, or ``remedy``."""
        if key in self._from_env:
            where = f"change ${self._from_env[key]}"
        elif self._file is not None:
            where = f"set {key} in {self._file}"
        else:
            where = f"set {key} in the config file (--config)"
        return ValueError(f"{key}: {error} ({where}{f', or {remedy}' if remedy else ''})")

    @contextmanager
    def about(self, key: str, remedy: str | None = None) -> Iterator[None]:
        """A ValueError in the block is about the value of ``key``: raised again as
        setting_error's sentence."""
        try:
            yield
        except ValueError as e:
            raise self.setting_error(key, e, remedy) from None

    @field_validator("*", mode="before")
    @classmethod
    def _plain_values(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None  # "*": a field validator of every field
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, bool) and _admits(annotation, (int, float)):
            # pydantic would read true as 1: a typo that must not pass as a number.
            raise ValueError("must be a number")
        if isinstance(value, str) and _admits(annotation, (Path,)):
            if not value.strip():
                raise ValueError("must not be empty")
            return Path(value).expanduser()
        return value


Settings = TypeVar("Settings", bound=SwarmrlSettings)


class _Environment(EnvSettingsSource):
    """``SWARMRL_<KEY>`` for every key but those in LOCATION_KEYS."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if field_name in LOCATION_KEYS:
            return None, field_name, False
        return super().get_field_value(field, field_name)


def check_listen(address: str) -> str:
    """A multiaddr a libp2p host can listen on: ip4 or ip6, then tcp (the shard server
    listens on the same address)."""
    if _protocols(address)[:2] not in (["ip4", "tcp"], ["ip6", "tcp"]):
        raise ValueError("must be a multiaddr like /ip4/127.0.0.1/tcp/4001")
    return address


def check_peer(address: str) -> str:
    """A multiaddr to dial a peer: an address, then /p2p/ and the peer id."""
    names = _protocols(address)
    if len(names) < 2 or names[-1] != "p2p":
        raise ValueError("must be a multiaddr that ends in /p2p/<peer id>")
    return address


def split_commas(value: object) -> object:
    """A list setting given as "a,b" (from the environment): multiaddrs hold no commas."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def check_peers(key: str, addresses: list[str]) -> list[str]:
    """Every entry of the list setting `key` a peer's multiaddr (see check_peer)."""
    for address in addresses:
        try:
            check_peer(address)
        except ValueError as e:
            raise SettingError((key,), f"{key} {address[:100]!r} {e}") from None
    return addresses


def _protocols(address: str) -> list[str]:
    import multiaddr

    try:
        return [p.name for p in multiaddr.Multiaddr(address).protocols()]
    except ValueError:
        return []


def heading(title: str) -> dict[str, Any]:
    """``json_schema_extra`` for the first field of a group: the template puts ``title``
    above it."""
    return {"heading": title}


def load_settings(model_cls: type[Settings], path: Path | None) -> Settings:
    """The settings from ``path`` (a TOML file; None: none) and the environment.

    Raises ValueError with one sentence naming the file or the environment variable and
    the key: a missing or unreadable file, a TOML syntax error (with its line), an unknown
    key, a value of the wrong type or out of range."""
    from_file = _read_toml(path) if path is not None else {}
    source = str(path) if path is not None else "settings"
    for key in from_file:
        if key not in model_cls.model_fields:
            raise ValueError(f"{source}: unknown key {key!r}{_did_you_mean(key, model_cls)}")
    env = _env_names(model_cls)
    # Environment over file: a key the environment sets is left to the environment source.
    values = {key: value for key, value in from_file.items() if key not in env}
    if path is not None:
        values = _relative_to(values, path.absolute().parent, model_cls)
    try:
        settings = model_cls(**values)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        raise ValueError(_sentence(first, env, from_file, source)) from None
    settings._file, settings._from_env, settings._from_file = path, env, frozenset(from_file)
    return settings


def write_settings(
    path: Path,
    values: Mapping[str, object],
    template_of: type[SwarmrlSettings] | None = None,
) -> Path:
    """Writes a settings file atomically: ``values`` only, or with ``template_of`` the
    commented template of that model with ``values`` in place of the defaults. The one
    writer of settings files: every path in it is absolute (a relative one is taken as
    relative to the working directory now), so it means the same file however the file
    is moved or read (relative paths in a file are the file's folder's)."""
    text = template(template_of, values) if template_of else _entries(values)
    write_atomically(path, text.encode())
    return path


def template(model_cls: type[SwarmrlSettings], values: Mapping[str, object] | None = None) -> str:
    """A commented TOML file of every key with its description and its default, or its
    value in ``values`` (None: the default); loaded back, it gives those values and the
    defaults. A key without a default (None) is left commented out. Paths are written
    absolute (see write_settings)."""
    values = {key: value for key, value in (values or {}).items() if value is not None}
    unknown = set(values) - set(model_cls.model_fields)
    if unknown:
        raise ValueError(f"{model_cls.__name__} has no key {sorted(unknown)[0]!r}")
    lines = [f"# {line}" if line else "#" for line in _header(model_cls)]
    for key, field in model_cls.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if "heading" in extra:
            lines += ["", f"# == {extra['heading']} =="]
        lines.append("")
        lines += [f"# {line}" for line in textwrap.wrap(_help(field), _TEMPLATE_WIDTH)]
        value = values.get(key, field.get_default(call_default_factory=True))
        if value is None:
            example = extra.get("example")
            lines.append(f"# {key} = {_toml_value(example)}" if example else f"# {key} =")
        else:
            lines.append(_entry(key, value, is_path=_admits(field.annotation, (Path,))))
    return "\n".join(lines) + "\n"


def _entries(values: Mapping[str, object]) -> str:
    """``key = value`` lines for the values that are set; Path values written absolute."""
    lines = [
        _entry(key, value, is_path=isinstance(value, Path))
        for key, value in values.items()
        if value is not None
    ]
    return "\n".join(lines) + "\n"


def _entry(key: str, value: object, *, is_path: bool) -> str:
    if is_path:
        # Relative to where the writer runs, as the user meant it; written relative, it
        # would be read as relative to the file's folder.
        value = Path(str(value)).expanduser().absolute()
    return f"{key} = {_toml_value(value)}"


def reference_markdown(model_cls: type[BaseModel]) -> str:
    """A markdown table: key | default | description, one row per key."""
    rows = ["| key | default | description |", "| --- | --- | --- |"]
    for key, field in model_cls.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = "unset" if default is None else f"`{_toml_value(default)}`"
        cells = (f"`{key}`", shown, _help(field))
        rows.append("| " + " | ".join(_markdown_cell(cell) for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def _markdown_cell(text: str) -> str:
    # "<peer id>" would read as an HTML tag, "|" as the end of the cell.
    return text.replace("|", "\\|").replace("<", "&lt;")


# -- reading ---------------------------------------------------------------------


def _read_toml(path: Path) -> dict[str, Any]:
    check_input_file(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or 'the file system refused'}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{path} is too large for a settings file (over 1 MiB)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}{_toml_error(str(e), text)}") from None


def _toml_error(message: str, text: str) -> str:
    """tomllib's 'Invalid value (at line 3, column 9)' as ', line 3: invalid value'."""
    message = message[:1].lower() + message[1:]
    if m := re.fullmatch(r"(.*) \(at line (\d+), column \d+\)", message, re.DOTALL):
        return f", line {m[2]}: {m[1]}"
    if m := re.fullmatch(r"(.*) \(at end of document\)", message, re.DOTALL):
        return f", line {max(1, len(text.splitlines()))}: {m[1]}"
    return f": {message}"


def _did_you_mean(key: str, model_cls: type[SwarmrlSettings]) -> str:
    close = difflib.get_close_matches(key, list(model_cls.model_fields), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _env_names(model_cls: type[SwarmrlSettings]) -> dict[str, str]:
    """key -> the environment variable that sets it, as it is spelt in the environment."""
    wanted = {
        f"{ENV_PREFIX}{key}".lower(): key
        for key in model_cls.model_fields
        if key not in LOCATION_KEYS
    }
    return {wanted[name.lower()]: name for name in os.environ if name.lower() in wanted}


def _relative_to(
    values: dict[str, Any], folder: Path, model_cls: type[SwarmrlSettings]
) -> dict[str, Any]:
    """A daemon may run from any working directory: a relative path in a file means the
    file's folder."""
    resolved = dict(values)
    for key, value in values.items():
        if not (isinstance(value, str) and value.strip()):
            continue
        if not _admits(model_cls.model_fields[key].annotation, (Path,)):
            continue
        path = Path(value).expanduser()
        resolved[key] = str(path if path.is_absolute() else folder / path)
    return resolved


def _admits(annotation: Any, kinds: tuple[type, ...]) -> bool:
    """Whether ``annotation`` is one of ``kinds`` or an optional/union of one."""
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_admits(arg, kinds) for arg in get_args(annotation))
    return isinstance(annotation, type) and annotation in kinds


# -- errors in the user's terms ---------------------------------------------------


def _source_of(
    keys: tuple[str, ...], env: dict[str, str], from_file: dict[str, Any], file: str
) -> str:
    for key in keys:
        if key in env:
            return env[key]
        if key in from_file:
            return file
    return file


def _sentence(
    error: ErrorDetails,
    env: dict[str, str],
    from_file: dict[str, Any],
    file: str,
) -> str:
    loc = error["loc"]
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, SettingError):
        return f"{_source_of(cause.keys, env, from_file, file)}: {cause}"
    key = str(loc[0]) if loc else ""
    where = _source_of((key,), env, from_file, file)
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown key {key!r}"
    what = problem(error, ctx)
    value = error["input"]
    return f"{where}: {key} {what}, got {_shown(value, from_env=key in env)}"


def _shown(value: Any, *, from_env: bool) -> str:
    """The bad value as the user wrote it: raw from the environment, TOML from the file."""
    if from_env:
        return _cut(str(value)) if str(value).strip() else "an empty value"
    if isinstance(value, dict):
        return "a table"
    return _cut(_toml_value(value) if _renderable(value) else str(value))


def problem(error: ErrorDetails, ctx: dict[str, Any]) -> str:
    """What is wrong with a value, from pydantic's ``error`` and its ``ctx``, in the words
    of these sentences ("must be at least 2"), for whoever reports it."""
    kind = error["type"]
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("more than", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
    }
    if kind in bounds:
        words, name = bounds[kind]
        return f"must be {words} {_number(ctx[name])}"
    if kind == "value_error":
        return str(ctx["error"])
    if kind == "literal_error":
        return f"must be one of {ctx['expected'].replace(chr(39), '')}"
    if kind.startswith("int"):
        return "must be a whole number"
    if kind.startswith("float") or kind == "finite_number":
        return "must be a finite number"
    if kind == "string_too_short":
        return "must not be empty"
    if kind.startswith("string"):
        return "must be a string"
    if kind.startswith("path"):
        return "must be a path"
    if kind.startswith("list"):
        return "must be a list"
    # A rule pydantic checks that none of our fields uses today: its own words, short.
    return "is not valid: " + error["msg"][:1].lower() + error["msg"][1:]


def _cut(text: str) -> str:
    return text if len(text) <= MAX_QUOTED_CHARS else text[:MAX_QUOTED_CHARS] + "..."


def _number(value: object) -> str:
    """A bound as a sentence states it: a whole number without a decimal point."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return str(int(value))
    return repr(value)


# -- writing -----------------------------------------------------------------------


def _header(model_cls: type[SwarmrlSettings]) -> list[str]:
    doc = (model_cls.__doc__ or model_cls.__name__).strip()
    paragraphs = [textwrap.fill(" ".join(p.split()), _TEMPLATE_WIDTH) for p in doc.split("\n\n")]
    return [
        *"\n\n".join(paragraphs).splitlines(),
        "",
        *_precedence(model_cls),
        "Relative paths are relative to the folder of this file.",
    ]


def _precedence(model_cls: type[SwarmrlSettings]) -> list[str]:
    """Which variables override the file, and which only move a default (LOCATION_KEYS)."""
    keys = [key for key in model_cls.model_fields if key in LOCATION_KEYS]
    return [
        f"Every key is optional; {ENV_PREFIX}<KEY> in the environment overrides this file, except",
        "these variables, which say where things live for every swarmrl command: each only",
        "moves the default of its key, and the key set in this file wins over it.",
        *(f"  ${ENV_PREFIX}{key.upper()} moves {key}: {LOCATION_KEYS[key]}" for key in keys),
    ]


def _help(field: FieldInfo) -> str:
    text = " ".join((field.description or "").split())
    bounds = []
    for rule in field.metadata:
        if isinstance(rule, Ge):
            bounds.append(f"at least {_number(rule.ge)}")
        elif isinstance(rule, Gt):
            bounds.append(f"more than {_number(rule.gt)}")
        elif isinstance(rule, Le):
            bounds.append(f"at most {_number(rule.le)}")
        elif isinstance(rule, Lt):
            bounds.append(f"less than {_number(rule.lt)}")
    if not bounds:
        return text
    rule = ", ".join(bounds)
    return f"{text} {rule[:1].upper()}{rule[1:]}."


def _renderable(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return all(_renderable(v) for v in value)
    return isinstance(value, str | bool | int | float | Path)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)  # TOML's own inf/nan spelling, quoted back in errors only
        return repr(value)
    if isinstance(value, Path):
        return _toml_string(_home_as_tilde(value))
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _home_as_tilde(path: Path) -> str:
    """``~/...`` reads better than the absolute home, and loads back the same."""
    home = Path.home()
    if path.is_absolute() and path.is_relative_to(home) and path != home:
        return f"~/{path.relative_to(home)}"
    return str(path)


def _toml_string(text: str) -> str:
    escaped = []
    for char in text:
        if char in ('"', "\\"):
            escaped.append("\\" + char)
        elif char == "\n":
            escaped.append("\\n")
        elif char == "\t":
            escaped.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            escaped.append(f"\\u{ord(char):04x}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'
