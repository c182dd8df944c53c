"""The service image installs the extras the services need, pinned by deploy/constraints-services.txt.

No Docker engine here: the Dockerfile's install line is checked as text, and the constraints file against
the dependency closure of the ``services`` and ``report`` extras (read from the installed metadata)."""
from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "deploy" / "constraints-services.txt"
IMAGE_EXTRAS = ("services", "report")


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9.+!-]+)", line)
            assert m, f"not an exact pin: {line!r}"
            pins[canonicalize_name(m[1])] = m[2]
    return pins


def _extras_closure(extras) -> set[str]:
    """Third-party distributions the project's extras pull (transitively), markers evaluated here."""
    extra_reqs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    todo, seen = [], set()
    for e in extras:
        todo += [Requirement(r) for r in extra_reqs[e]]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name == "dynamiccl":              # a self-reference: dynamiccl[services]
            todo += [Requirement(r) for e in req.extras for r in extra_reqs[e]]
            continue
        if name in seen:
            continue
        seen.add(name)
        try:
            deps = requires(req.name) or []
        except PackageNotFoundError:
            pytest.skip(f"{req.name} is not installed here: cannot resolve the extras' closure")
        for d in map(Requirement, deps):
            if d.marker is None or d.marker.evaluate({"extra": ""}):
                todo.append(d)
    return seen


def _install_line(dockerfile: str) -> str:
    final = dockerfile.rsplit("\nFROM ", 1)[1]
    lines = [ln for ln in final.replace("\\\n", " ").splitlines() if "pip install" in ln]
    assert len(lines) == 1, lines
    return lines[0]


def test_image_installs_the_service_extras_with_the_constraints_file():
    dockerfile = (ROOT / "Dockerfile").read_text()
    default = re.search(r'^ARG EXTRAS="([^"]*)"', dockerfile, re.M)
    assert default, "the runtime stage names its default extras"
    assert set(default[1].split(",")) >= set(IMAGE_EXTRAS)
    line = _install_line(dockerfile)
    copied = re.search(r"^COPY deploy/constraints-services\.txt (\S+)", dockerfile, re.M)
    assert copied, "the constraints file is copied into the runtime stage"
    assert re.search(rf"pip install -c {re.escape(copied[1])} ", line), line
    assert "${EXTRAS:+[${EXTRAS}]}" in line


def test_constraints_pin_exactly_what_the_extras_resolve_to():
    pins = _pins()
    closure = _extras_closure(IMAGE_EXTRAS)
    assert set(pins) == closure, (f"not pulled by the extras: {sorted(set(pins) - closure)}; "
                                  f"unpinned: {sorted(closure - set(pins))}")
    assert "dynamiccl" not in pins   # the package itself stays unpinned (ranges in pyproject.toml)


def test_pyproject_keeps_ranges_not_the_image_pins():
    extra_reqs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for e in IMAGE_EXTRAS:
        for r in map(Requirement, extra_reqs[e]):
            assert not any(s.operator == "==" for s in r.specifier), r
