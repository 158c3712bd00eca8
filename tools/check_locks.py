"""Checks, offline, that the two locks are what resolving pyproject.toml gives.

requirements.lock     pyproject's dependencies + the dev extra: what CI and `make test` use.
requirements-gpu.lock the same + the gpu extra (vLLM), resolved with vLLM's own pins
                      (it pins torch and caps transformers below requirements.lock's):
                      what `make gpu-setup` installs.

`make lint` runs `python tools/check_locks.py`, which needs no network:

* each lock's header is the `uv pip compile` command `make lock` runs for it (the target
  Python and platform, the extras);
* requirements-gpu.lock records a digest of the pyproject requirements it was resolved
  from (requires-python, dependencies, the gpu and dev extras), and it must be the digest
  of the current ones: edit a requirement and the check fails until `make lock`;
* every requirement of pyproject that applies to the lock's target (Python 3.11,
  x86_64 Linux) is pinned in it, at a version its range admits: the project's own ranges
  (torch>=..., transformers>=...) admit both locks' pins, so the project is tested, and
  claims to work, on the versions it pins;
* everything requirements.lock pins is pinned in requirements-gpu.lock too (it resolves
  a superset of the requirements).

A real re-resolve needs PyPI and its answer changes with every upstream release, so it
is `make lock`'s job, not lint's. `make lock` also runs `seed` (before resolving the gpu
lock: uv prefers the versions in its output file, so this makes it keep requirements.lock's
pins wherever vLLM allows, and its own otherwise) and `stamp` (after: writes the digest).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
CPU_LOCK = ROOT / "requirements.lock"
GPU_LOCK = ROOT / "requirements-gpu.lock"

# What `make lock` runs for each lock, as uv writes it into the lock's header.
COMPILE = "uv pip compile --python-version 3.11 --python-platform x86_64-manylinux_2_28"
EXTRAS: dict[Path, tuple[str, ...]] = {CPU_LOCK: ("dev",), GPU_LOCK: ("gpu", "dev")}
# The target both are resolved for, for evaluating requirement markers.
TARGET = {
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
}
DIGEST_PREFIX = "# pyproject requirements digest: "
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def command(lock: Path) -> str:
    extras = " ".join(f"--extra {e}" for e in EXTRAS[lock])
    return f"{COMPILE} {extras} pyproject.toml -o {lock.name}"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict[str, Any]:
    data: dict[str, Any] = tomllib.loads(PYPROJECT.read_text())["project"]
    return data


def requirements(extras: tuple[str, ...]) -> list[str]:
    """The requirement strings a lock with these extras is resolved from."""
    meta = project()
    optional: dict[str, list[str]] = meta.get("optional-dependencies", {})
    found = list(meta.get("dependencies", []))
    for extra in extras:
        found += optional[extra]
    return found


def digest() -> str:
    """Of what the gpu lock's resolution reads from pyproject (comments and order aside)."""
    inputs = {
        "requires-python": project().get("requires-python", ""),
        "requirements": sorted(" ".join(r.split()) for r in requirements(EXTRAS[GPU_LOCK])),
        "command": command(GPU_LOCK),
    }
    return "sha256:" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def pins(lock: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        match = PIN.match(line)
        if match:
            found[normalize(match[1])] = match[2]
    return found


def check() -> list[str]:
    from packaging.requirements import Requirement
    from packaging.version import Version

    errors: list[str] = []
    for lock in (CPU_LOCK, GPU_LOCK):
        if not lock.exists():
            errors.append(f"{lock.name} is missing: run `make lock`")
            continue
        header = lock.read_text().splitlines()[:4]
        if f"#    {command(lock)}" not in header:
            errors.append(f"{lock.name}: its header is not `{command(lock)}`: run `make lock`")
        pinned = pins(lock)
        for text in requirements(EXTRAS[lock]):
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(TARGET):
                continue
            version = pinned.get(normalize(req.name))
            if version is None:
                errors.append(f"{lock.name} pins no {req.name} (pyproject: {text}): make lock")
            elif not req.specifier.contains(Version(version), prereleases=True):
                errors.append(
                    f"{lock.name} pins {req.name}=={version}, outside pyproject's {text!r}"
                )
    if GPU_LOCK.exists():
        lines = GPU_LOCK.read_text().splitlines()
        recorded = next(
            (ln[len(DIGEST_PREFIX) :] for ln in lines if ln.startswith(DIGEST_PREFIX)), ""
        )
        if recorded != digest():
            errors.append(
                f"{GPU_LOCK.name} was not resolved from the current pyproject.toml "
                "requirements (its digest differs): run `make lock`"
            )
        if CPU_LOCK.exists():
            missing = sorted(set(pins(CPU_LOCK)) - set(pins(GPU_LOCK)))
            if missing:
                errors.append(f"{GPU_LOCK.name} lacks what requirements.lock pins: {missing}")
    return errors


def seed() -> None:
    """Writes uv's preferences into the gpu lock: requirements.lock's pins, then its own."""
    preferred = pins(GPU_LOCK) if GPU_LOCK.exists() else {}
    preferred.update(pins(CPU_LOCK))
    GPU_LOCK.write_text("".join(f"{n}=={v}\n" for n, v in sorted(preferred.items())))


def stamp() -> None:
    """Records the digest below uv's header."""
    lines = [ln for ln in GPU_LOCK.read_text().splitlines() if not ln.startswith(DIGEST_PREFIX)]
    at = next(i for i, ln in enumerate(lines) if not ln.startswith("#"))
    lines.insert(at, DIGEST_PREFIX + digest())
    GPU_LOCK.write_text("\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else "check"
    if mode == "seed":
        seed()
    elif mode == "stamp":
        stamp()
    elif mode == "check":
        errors = check()
        for error in errors:
            print(f"check_locks: {error}", file=sys.stderr)
        return 1 if errors else 0
    else:
        print("usage: check_locks.py [check|seed|stamp]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
