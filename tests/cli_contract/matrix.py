"""The bad-input matrix: for every parameter of every command, values that must be
refused, each put into an otherwise valid and cheap command line. And for every path
parameter, a pair of command lines that give one path absolute and relative to the
command's working folder (`build_relative_pairs`): a relative path is the caller's.

What a parameter means (a model folder, an output file, an address) is looked up by
its name; its type (int, float, path, ...) gives the generic cases. A parameter
whose name is not known here is reported by `unknown_params`, so a new command is
classified once and then covered like the rest.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tests.cli_contract.commands import Command, Param
from tests.cli_contract.world import ADDRESS, KEY_NAME, World

BAD_COMMAND_LINE = frozenset({2})
BAD_INPUT = frozenset({1, 2})
HUGE_INT = str(10**80)  # beyond uint256, so beyond every bound a command could have

# What a path parameter holds, by name; "<command> <name>" overrides.
PATH_ROLES = {
    "model": "model",
    "tasks": "tasks",
    "completions": "completions",
    "file": "rollouts",
    "keystore_file": "keystore",
    "private_key_file": "private-key",
    "password_file": "password",
    "deployment": "deployment",
    "keystore_dir": "keystore-dir",
    "state_dir": "state-dir",
    "store": "out-dir",
    "out": "out-file",
    "path": "weights",
    "config": "config",
    "export_file": "export-file",
    "consent_file": "consent-file",
    "consent_out": "out-file",
    "data_dir": "out-dir",
    "demo out": "out-dir",
    "model init out": "out-dir",
    "model import-smollm2 out": "out-dir",
    "train local out": "out-dir",
    "weights pull out": "out-dir",
    "bench load json_out": "out-file",
    "bench load profile": "out-file",
    "bench chain json_out": "out-file",
}

# What a string parameter holds, by name; "<command> <name>" overrides.
STR_ROLES = {
    "name": "key-name",
    "key": "key-name",
    "provider": "key-name",
    "provider_address": "address",
    "wallet new name": "new-key-name",
    "wallet import name": "new-key-name",
    "amount": "amount",
    "node": "address",
    "treasury": "address",
    "recorder": "address",
    "validator": "address",
    "trust": "address",
    "to": "address",
    "rpc_url": "rpc-url",
    "backend": "choice",
    "device": "device",
    "source": "choice",
    "targets": "targets",
    "advantage_scale": "choice",
    "scenes": "choice",
    "ratio_against": "choice",
    "listen": "multiaddr",
    "bootstrap": "multiaddr",
    "run": "run-name",
    "model": "model-name",
    "rdzv_endpoint": "host-port",
    "duration": "duration",
    "consent_valid_for": "consent-duration",
    "bench chain nodes": "targets",
}

STR_BAD_VALUES = {
    "key-name": ["", "no-such-key", "../escape", "ünïcode\u202e"],
    "new-key-name": ["", "../escape", "-dash", "a/b", "k" * 300, "ünïcode\u202e"],
    "amount": [
        "",
        "-1",
        "abc",
        "1_000",
        "1e3",
        "\uff11\uff10",
        "0x10",
        "1" + "0" * 80,
        " 1",
        "nan",
    ],
    "address": ["", "0x123", "not-an-address", "0x" + "zz" * 20, "\uff10x" + "12" * 20],
    "rpc-url": ["", "not a url", "ftp://127.0.0.1:1/"],
    "choice": ["", "no-such-choice", "ünïcode\u202e"],
    "device": ["", "no-such-device", "cuda:99"],
    "targets": ["", "abc", "0", "-5", "1,,2", HUGE_INT],
    "multiaddr": ["", "garbage", "/ip4/999.0.0.1/tcp/1", "/ip4/127.0.0.1/tcp/99999"],
    "run-name": [""],
    "model-name": [""],
    "host-port": ["", "no-port", "127.0.0.1:0", "127.0.0.1:99999", "ünïcode\u202e:1"],
    # A snooze: a second to 7 days; a bare number is minutes.
    "duration": ["", "soon", "0", "-1h", "1.5h", "8d", "0s", HUGE_INT],
    # A consent's lifetime: a minute to 30 days.
    "consent-duration": ["", "soon", "0", "-1h", "1.5h", "30s", "31d", HUGE_INT],
}


def _valid_str(world: World, command: str, param: Param) -> str:
    role = STR_ROLES.get(f"{command} {param.name}", STR_ROLES.get(param.name))
    return {
        "key-name": KEY_NAME,
        "new-key-name": "fresh-key",
        "amount": "1",
        "address": ADDRESS,
        "rpc-url": world.rpc_url,
        # A peer that is not there: the dial fails on 127.0.0.1.
        "multiaddr": world.peer_addr,
        "run-name": "contract",
        "duration": "30m",
        "consent-duration": "1d",
    }.get(role, "x")


# Options every case of a command carries: they keep an accepted command line cheap
# (one tiny sample on the CPU), and reach the code that reads the optional inputs (a
# key makes `rollouts generate` and `weights pull` read the keystore).
EXTRA = {
    "eval": "--n 1 --max-tokens 2 --device cpu",
    "tasks generate": "--n 1",
    "tasks filter": "--k 1 --max-tokens 2 --device cpu",
    "rollouts generate": f"--n 1 --max-tokens 2 --targets 2 --device cpu --key {KEY_NAME}",
    "rollouts verify": "--device cpu",
    "train local": "--steps 1 --group-size 2 --prompts-per-step 1 --max-tokens 2 "
    "--target-len 2 --workers 1 --device cpu",
    "weights pull": f"--timeout 1 --key {KEY_NAME}",
    "chain deploy": f"--validator {ADDRESS} --recorder {ADDRESS} --treasury {ADDRESS}",
    "node init": f"--provider {KEY_NAME}",
}
# The options a case carries in place of its command's EXTRA when the parameter given a
# bad value is "<command> <name>": the one that only matters with others ({s}: the
# case's folder). A consent is signed for a provider's address into a file, where the
# provider's key is not on the machine.
EXTRA_WITH = {
    "node init provider_address": "--consent-out {s}/consent.json",
    "node init consent_out": f"--provider-address {ADDRESS}",
    "node init consent_valid_for": f"--provider-address {ADDRESS} --consent-out {{s}}/consent.json",
}

# Commands that do long work by design on any value they accept (benchmarks, the whole
# demo, training): the fast form leaves out their huge and infinite values, which a
# missing bound lets run until the case's time limit; the long form has them.
HEAVY = ("bench", "demo", "train")
# Commands whose accepted form runs for minutes or starts what outlives it (a chain, a
# server, the demo): their relative case is a path they refuse, rather than one they
# would run on.
LONG_WHEN_ACCEPTED = (
    "bench",
    "demo",
    "chain up",
    "model init",
    "model import-smollm2",
    "train local",
    "weights serve",
)
# Roles of paths a command writes; the others are read.
OUTPUT_ROLES = ("out-file", "out-dir", "state-dir")
# Damaged inputs that exist, so that a command that looked for one elsewhere than the
# caller's folder would say something else ("does not exist").
_EXISTING_DAMAGE = ("directory", "a-file", "empty")
# An output's name in the case's folder: distinct from any word of a message.
GIVEN_NAME = "given-here"


@dataclass(frozen=True)
class Case:
    """One command line to run, what it may exit with, and what to lay out first."""

    ident: str  # unique, safe as a folder name
    command: str
    label: str
    argv: tuple[str, ...]
    expect: frozenset[int]
    # Folders the command may change although the input is bad (a stale pid file that
    # `chain down` removes).
    may_change: tuple[str, ...] = ()

    def shown(self) -> str:
        return "swarmrl " + " ".join(_quote(a) for a in self.argv)


@dataclass(frozen=True)
class RelativePair:
    """One path parameter given absolute (``absolute``) and relative to the working
    folder of the command (``relative``, whose case runs in its own folder): both must
    end alike, saying the same of the path and creating the same files in their
    folders. ``given`` holds, per case ident, the spellings of the path it was given
    (as typed and as resolved), so messages compare once the path is blanked out."""

    command: str
    label: str
    absolute: Case
    relative: Case
    given: dict[str, tuple[str, ...]]


def _quote(arg: str) -> str:
    if arg and re.fullmatch(r"[\w./:=@,+-]+", arg):
        return arg
    shown = arg if len(arg) <= 60 else arg[:40] + f"...({len(arg)} chars)"
    return repr(shown)


def role(command: Command, param: Param) -> str | None:
    table = PATH_ROLES if param.kind == "path" else STR_ROLES
    return table.get(f"{command.shown} {param.name}", table.get(param.name))


def unknown_params(commands: list[Command]) -> list[str]:
    """Path and string parameters the matrix does not know the meaning of."""
    return [
        f"{c.shown} {p.shown}"
        for c in commands
        for p in c.params
        if p.kind in ("path", "str") and role(c, p) is None
    ]


class _Builder:
    def __init__(self, world: World, command: Command, *, long: bool) -> None:
        self.world = world
        self.command = command
        self.long = long
        self.cases: list[Case] = []

    def scratch(self, ident: str) -> Path:
        return self.world.root / "cases" / ident

    def valid(self, param: Param, scratch: Path) -> str:
        """A value of ``param`` that the command accepts."""
        if param.kind == "path":
            r = role(self.command, param)
            if r == "out-file":
                suffix = ".json" if self.command.shown == "chain deploy" else ".parquet"
                return str(scratch / f"out{suffix}")
            if r in ("out-dir", "state-dir"):
                return str(scratch / "out")
            if r == "keystore-dir":
                return str(self.world.home / "keystore")
            return str(self.world.valid[r])
        if param.kind == "str":
            return _valid_str(self.world, self.command.shown, param)
        return {"int": "1", "float": "1.0", "bool": ""}[param.kind]

    def argv(self, scratch: Path, bad: Param | None, value: str | None) -> list[str]:
        """The command line: every required parameter valid except ``bad``, which gets
        ``value`` (None: left out)."""
        argv = list(self.command.path)
        cheap = EXTRA.get(self.command.shown, "")
        if bad is not None:
            cheap = EXTRA_WITH.get(f"{self.command.shown} {bad.name}", cheap)
        cheap = [a.replace("{s}", str(scratch)) for a in cheap.split()]
        for p in self.command.params:
            if p is bad:
                if value is None:
                    continue
                if p.flag is None:
                    argv.append(value)
                else:
                    argv.append(f"{p.flag}={value}" if value.startswith("-") else p.flag)
                    if not value.startswith("-"):
                        argv.append(value)
                if p.flag in cheap:
                    i = cheap.index(p.flag)
                    del cheap[i : i + 2]
            elif p.required:
                if p.flag is not None:
                    argv.append(p.flag)
                argv.append(self.valid(p, scratch))
        return argv + cheap

    def add(
        self,
        label: str,
        bad: Param | None,
        value: str | None,
        expect: frozenset[int] = BAD_INPUT,
        may_change: tuple[str, ...] = (),
    ) -> None:
        slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{self.command.shown} {label}").strip("-")
        ident = f"{len(self.cases):03d}-{slug}"[:80]
        scratch = self.scratch(ident)
        if value is not None:
            value = value.replace("{s}", str(scratch))
        argv = self.argv(scratch, bad, value)
        self.cases.append(Case(ident, self.command.shown, label, tuple(argv), expect, may_change))

    def relative_pairs(self) -> list[RelativePair]:
        """For each path parameter, the pair of cases that give it absolute and relative
        to the command's working folder."""
        pairs = []
        for p in self.command.params:
            if p.kind != "path":
                continue
            r = role(self.command, p)
            long = self.command.shown.startswith(LONG_WHEN_ACCEPTED)
            if r in OUTPUT_ROLES:
                # A new name: the command writes it there; a long command refuses what
                # the case's folder holds in the output's way (its folder where a file
                # goes, its file where a folder goes).
                in_the_way = "taken" if r == "out-file" else "a-file"
                name = in_the_way if long else self.output_name(r)
                place, what = (lambda scratch, name=name: scratch / name), f"output {name}"
            else:
                label = next(k for k in _EXISTING_DAMAGE if k in self.world.damaged[r])
                target = self.world.damaged[r][label]
                place, what = (lambda scratch, target=target: target), f"{label} input"
            cases = {}
            given: dict[str, tuple[str, ...]] = {}
            for form in ("absolute", "relative"):
                slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{self.command.shown} {p.shown}")
                ident = f"relative-{slug.strip('-')}-{form}"
                scratch = self.scratch(ident)
                path = place(scratch)
                value = str(path) if form == "absolute" else os.path.relpath(path, scratch)
                argv = self.argv(scratch, p, value)
                cases[form] = Case(ident, self.command.shown, f"{p.shown} {what}", tuple(argv),
                                   BAD_INPUT | {0})  # fmt: skip
                given[ident] = (value, str(scratch / value), str(path))
            pairs.append(
                RelativePair(
                    self.command.shown,
                    f"{p.shown} {what}, relative to the working folder",
                    cases["absolute"],
                    cases["relative"],
                    given,
                )
            )
        return pairs

    def output_name(self, r: str) -> str:
        if r == "out-file":
            return GIVEN_NAME + (".json" if self.command.shown == "chain deploy" else ".parquet")
        return GIVEN_NAME

    def build(self) -> list[Case]:
        heavy = self.command.shown.startswith(HEAVY)
        self.add("an extra argument", None, None, BAD_COMMAND_LINE)
        self.cases[-1] = _with_extra(self.cases[-1])
        for p in self.command.params:
            if p.required:
                self.add(f"{p.shown} left out", p, None, BAD_COMMAND_LINE)
            if p.flag is not None and p.kind != "bool":
                self.add(f"{p.shown} without a value", p, None, BAD_COMMAND_LINE)
                self.cases[-1] = _with_dangling(self.cases[-1], p.flag)
            for label, value, expect in self.bad_values(p, heavy):
                self.add(f"{p.shown} {label}", p, value, expect)
            if role(self.command, p) == "state-dir":
                self.add_stale_pid_files(p)
        return self.cases

    def bad_values(self, p: Param, heavy: bool) -> list[tuple[str, str, frozenset[int]]]:
        """(label, value, allowed exit codes) for each bad value of ``p``."""
        if p.kind == "bool":
            return []
        if p.kind == "choice":
            return [(f"= {v!r}", v, BAD_INPUT) for v in STR_BAD_VALUES["choice"]]
        if p.kind in ("int", "float"):
            values = _numeric_values(p, heavy=heavy and not self.long)
        elif p.kind == "str":
            r = role(self.command, p)
            values = [(f"= {v!r}", v) for v in STR_BAD_VALUES.get(r, [""])]
        elif role(self.command, p) == "keystore-dir":
            return self.keystore_dir_values()
        else:
            values = self.path_values(p)
        return [(label, value, BAD_INPUT) for label, value in values]

    def _has_role(self, wanted: str) -> bool:
        return any(role(self.command, p) == wanted for p in self.command.params)

    def keystore_dir_values(self) -> list[tuple[str, str, frozenset[int]]]:
        """A keystore folder matters as far as the command reads the key in it: a new
        key's command only needs a folder; a wrong MAC or address shows only to a
        command that decrypts (one that takes a password)."""
        variants = self.world.damaged["keystore-dir"]
        if self._has_role("new-key-name"):
            return [("a-file", str(variants["a-file"]), BAD_INPUT)]
        decrypts = self._has_role("password")
        listing = self.command.shown == "wallet list"
        values = []
        for label, path in variants.items():
            seen_only_decrypting = label in ("bad-mac", "wrong-address") and not decrypts
            damaged_key_in_listing = listing and label != "a-file"
            ok = seen_only_decrypting or damaged_key_in_listing
            values.append((label, str(path), BAD_INPUT | {0} if ok else BAD_INPUT))
        return values

    def add_stale_pid_files(self, p: Param) -> None:
        """Pid files no running chain wrote: `chain up` starts a chain over them (not a
        case: it would start one), `status` and `down` may say there is none, or
        remove them, but never crash."""
        if self.command.shown == "chain up":
            return
        for label, folder in self.world.damaged["state-dir"].items():
            may_change = (str(folder),) if folder.is_dir() else ()
            self.add(f"{p.shown} {label}", p, str(folder), BAD_INPUT | {0}, may_change)

    def path_values(self, p: Param) -> list[tuple[str, str]]:
        r = role(self.command, p)
        if r == "out-file":
            # A missing folder above it is made when the file is written.
            return [
                ("is an existing folder", "{s}/taken"),
                ("under a file", "{s}/a-file/out.parquet"),
                ("under a file, deeper", "{s}/a-file/missing/out.parquet"),
                ("name too long", "{s}/" + "o" * 300 + ".parquet"),
            ]
        if r in ("out-dir", "state-dir"):
            return [("is a file", "{s}/a-file"), ("under a file", "{s}/a-file/out")]
        damaged = self.world.damaged[r]
        values = [(label, str(path)) for label, path in damaged.items()]
        if r == "password" and self._has_role("new-key-name"):
            # Any readable text is a new key's password, cut short or not.
            values = [v for v in values if v[0] not in ("truncated", "garbage")]
        if r == "tasks":
            jsonl = self.world.damaged["tasks-jsonl"]
            values += [(f"jsonl {label}", str(jsonl[label])) for label in ("garbage", "truncated")]
        return values


def _with_extra(case: Case) -> Case:
    return Case(case.ident, case.command, case.label, (*case.argv, "unexpected-extra"), case.expect)


def _with_dangling(case: Case, flag: str) -> Case:
    """The option given last with nothing after it."""
    argv = list(case.argv)
    # Drop the option wherever the valid line had it, then end with it bare.
    while flag in argv:
        i = argv.index(flag)
        del argv[i : i + 2]
    return Case(case.ident, case.command, case.label, (*argv, flag), case.expect)


def _numeric_values(p: Param, *, heavy: bool) -> list[tuple[str, str]]:
    values = [("negative", "-1"), ("not a number", "abc"), ("empty", "")]
    if not heavy:
        values.append(("huge", HUGE_INT if p.kind == "int" else "1e400"))
    if p.minimum is not None and p.minimum > 0:
        below = p.minimum - 1 if p.kind == "int" else p.minimum / 2
        values.append(("below its minimum", _number(below, p.kind)))
    if p.maximum is not None:
        above = p.maximum + 1 if p.kind == "int" else p.maximum * 2 + 1
        values.append(("above its maximum", _number(above, p.kind)))
    if p.kind == "float":
        values += [("nan", "nan"), ("-inf", "-inf")]
        if not heavy:
            values.append(("inf", "inf"))
    else:
        values.append(("a float", "1.5"))
    return values


def _number(value: float, kind: str) -> str:
    return str(int(value)) if kind == "int" else repr(float(value))


def build_cases(world: World, commands: list[Command], *, long: bool) -> list[Case]:
    """Every case of every command, in the order of the app."""
    cases: list[Case] = []
    for command in commands:
        cases += _Builder(world, command, long=long).build()
    return cases


def build_relative_pairs(world: World, commands: list[Command]) -> list[RelativePair]:
    """Every path parameter's pair of cases (see RelativePair), in the order of the app."""
    pairs: list[RelativePair] = []
    for command in commands:
        pairs += _Builder(world, command, long=False).relative_pairs()
    return pairs
