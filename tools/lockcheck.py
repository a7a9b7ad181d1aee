"""Check that each requirements*.lock still matches the requirements*.txt it was compiled from.

    python tools/lockcheck.py [INPUT LOCK ...]

With no arguments it checks the repository's three pairs (requirements.txt/requirements.lock,
requirements-dev.txt/requirements-dev.lock, requirements-bench.txt/requirements-bench.lock).
`make lint` runs it, so a lock left behind by an edit of its input fails CI; `make lock`
regenerates the locks with pip-compile.

It needs no network and resolves nothing: it reads the files. A lock is out of date when
- a requirement of the input (following `-r` includes; extras ignored; a requirement whose
  environment marker does not hold here is skipped) has no pin in the lock, or its pinned
  version lies outside the requirement's specifiers;
- the lock pins a package only for the input files (pip-compile's `# via -r FILE`
  annotations, no other package) that no input file lists any more;
- a line of the lock is not a plain `name==version` pin, or a package is pinned twice;
- two locks checked together pin one package at different versions (the dev lock is
  compiled against the run lock, the bench lock against the dev lock, so they agree).

Each problem is one line on stderr; the exit status is 1 when there is any, else 0.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

try:
    from packaging.markers import InvalidMarker
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a venv that pip has not installed into yet: pip carries its own copy
    from pip._vendor.packaging.markers import InvalidMarker
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    from pip._vendor.packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PAIRS = (
    ("requirements.txt", "requirements.lock"),
    ("requirements-dev.txt", "requirements-dev.lock"),
    ("requirements-bench.txt", "requirements-bench.lock"),
)
INCLUDE_OPTIONS = ("-r", "--requirement")
CONSTRAINT_OPTIONS = ("-c", "--constraint")
VIA_ITEM = re.compile(r"^#\s+(?:via\s+)?(.+?)\s*$")


@dataclass
class Wanted:
    """One requirement line of an input file."""

    requirement: Requirement
    where: str  # "requirements.txt:9"


@dataclass
class Pin:
    name: str  # as written in the lock
    version: str
    line: int
    via: list[str] = field(default_factory=list)  # pip-compile's annotation items


def _logical_lines(path: Path) -> list[tuple[int, str]]:
    """The lines of a requirements file with `\\` continuations joined, numbered from 1."""
    lines: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        lines.append((start, pending + raw))
        pending = ""
    if pending:
        lines.append((start, pending))
    return lines


def _strip_comment(line: str) -> str:
    # pip's rule: `#` starts a comment at the start of a line or after whitespace.
    return re.sub(r"(^|\s+)#.*$", "", line).strip()


def _option_value(line: str, options: tuple[str, ...]) -> str | None:
    for option in options:
        if line == option:
            return ""
        for separator in (" ", "="):
            if line.startswith(option + separator):
                return line[len(option) + 1 :].strip()
        if option.startswith("-") and not option.startswith("--") and line.startswith(option):
            return line[len(option) :].strip()  # -rfile
    return None


def read_input(path: Path, problems: list[str], seen: set[Path] | None = None) -> list[Wanted]:
    """Every requirement of `path` and of the files it includes with `-r`."""
    seen = set() if seen is None else seen
    path = path.resolve()
    if path in seen:
        return []
    seen.add(path)
    wanted: list[Wanted] = []
    for number, raw in _logical_lines(path):
        line = _strip_comment(raw)
        where = f"{_show(path)}:{number}"
        if not line:
            continue
        include = _option_value(line, INCLUDE_OPTIONS)
        if include is not None:
            target = (path.parent / include).resolve()
            if not include or not target.is_file():
                problems.append(f"{where}: the included file {include!r} does not exist")
                continue
            wanted.extend(read_input(target, problems, seen))
            continue
        if line.startswith("-"):  # -c constraints, index options, -e: not requirements
            continue
        try:
            requirement = Requirement(line)
        except (InvalidRequirement, InvalidMarker) as error:
            problems.append(f"{where}: cannot read {line!r}: {error}")
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        wanted.append(Wanted(requirement, where))
    return wanted


def read_lock(path: Path, problems: list[str]) -> dict[str, Pin]:
    """The pins of a lock by normalised name, with pip-compile's `# via` annotations."""
    pins: dict[str, Pin] = {}
    last: Pin | None = None
    for number, raw in _logical_lines(path):
        stripped = raw.strip()
        if not stripped:
            last = None
            continue
        if stripped.startswith("#"):
            if last is not None and raw[:1].isspace():
                item = VIA_ITEM.match(stripped)
                if item and stripped != "# via":
                    last.via.append(item.group(1))
            else:
                last = None
            continue
        where = f"{_show(path)}:{number}"
        text, _, inline = raw.partition(" #")
        text = re.sub(r"\s--hash[ =]\S+", "", " " + text).strip()
        last = None
        try:
            requirement = Requirement(text)
        except (InvalidRequirement, InvalidMarker):
            problems.append(f"{where}: {text!r} is not a pin (name==version): run make lock")
            continue
        specifiers = list(requirement.specifier)
        if (
            requirement.url
            or len(specifiers) != 1
            or specifiers[0].operator not in ("==", "===")
            or specifiers[0].version.endswith(".*")
        ):
            problems.append(f"{where}: {text!r} is not a pin (name==version): run make lock")
            continue
        name = canonicalize_name(requirement.name)
        if name in pins:
            problems.append(
                f"{where}: {requirement.name} is pinned twice (also line {pins[name].line})"
            )
            continue
        last = Pin(requirement.name, specifiers[0].version, number)
        inline = inline.strip()
        if inline.startswith("via "):
            last.via.extend(item.strip() for item in inline[4:].split(","))
        pins[name] = last
    return pins


def check_pair(input_path: Path, lock_path: Path) -> tuple[list[str], dict[str, Pin]]:
    """The problems of one input and its lock, and the lock's pins."""
    problems: list[str] = []
    for path in (input_path, lock_path):
        if not path.is_file():
            problems.append(f"{_show(path)} does not exist: run make lock")
    if problems:
        return problems, {}
    stale = f"{_show(lock_path)} is out of date with {_show(input_path)}"
    wanted = read_input(input_path, problems)
    pins = read_lock(lock_path, problems)
    listed = {canonicalize_name(item.requirement.name) for item in wanted}
    for item in wanted:
        requirement = item.requirement
        pin = pins.get(canonicalize_name(requirement.name))
        if requirement.url:
            problems.append(f"{item.where}: cannot check {requirement.name} @ a URL against a lock")
        elif pin is None:
            problems.append(
                f"{stale} ({item.where} asks for {_bare(requirement)}, which the lock does not"
                " pin): run make lock"
            )
        elif not requirement.specifier.contains(pin.version, prereleases=True):
            problems.append(
                f"{stale} ({item.where} asks for {_bare(requirement)}, the lock pins"
                f" {pin.name}=={pin.version}): run make lock"
            )
    for name, pin in pins.items():
        sources = [via for via in pin.via if via.startswith(("-r ", "-c "))]
        only_inputs = pin.via and len(sources) == len(pin.via)
        if only_inputs and any(via.startswith("-r ") for via in sources) and name not in listed:
            problems.append(
                f"{stale} ({pin.name}=={pin.version} is pinned for"
                f" {', '.join(sources)}, which no longer asks for it): run make lock"
            )
    return problems, pins


def check(pairs: list[tuple[Path, Path]]) -> list[str]:
    problems: list[str] = []
    seen: dict[str, tuple[Path, Pin]] = {}
    for input_path, lock_path in pairs:
        pair_problems, pins = check_pair(input_path, lock_path)
        problems.extend(pair_problems)
        for name, pin in pins.items():
            if name not in seen:
                seen[name] = (lock_path, pin)
                continue
            other_path, other = seen[name]
            if other.version != pin.version:
                problems.append(
                    f"{_show(lock_path)} pins {pin.name}=={pin.version} but {_show(other_path)}"
                    f" pins {other.name}=={other.version}: run make lock"
                )
    return problems


def _bare(requirement: Requirement) -> str:
    return f"{requirement.name}{requirement.specifier}"  # extras and markers left out


def _show(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(args) % 2:
        print("usage: python tools/lockcheck.py [INPUT LOCK ...]", file=sys.stderr)
        return 2
    if args:
        pairs = [(Path(args[i]), Path(args[i + 1])) for i in range(0, len(args), 2)]
    else:
        pairs = [(ROOT / source, ROOT / lock) for source, lock in PAIRS]
    problems = check(pairs)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
