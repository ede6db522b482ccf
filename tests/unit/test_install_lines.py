"""Every install line in the README, docs and the documented config installs this project.

`agentd` on PyPI is another project: a line that says `pip install agentd` (or an extra
this distribution does not have) would install something else, or fail.
"""

from __future__ import annotations

import re
import tomllib

from daemon_harness import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
EXTRAS = set(PYPROJECT["project"].get("optional-dependencies", {}))

#: pip install / pipx install followed by its arguments, to the end of the command
INSTALL = re.compile(r"\b(?:pip|pipx)\s+install\s+([^\n`#&;|]*)")


def _doc_files() -> list:
    return [REPO / "README.md", REPO / "conf" / "agentd.toml", *sorted((REPO / "docs").glob("*.md"))]


def _targets(args: str) -> list[str]:
    """The requirement arguments of one install command (options and their values left out)."""
    out, skip = [], False
    for word in args.split():
        if skip:
            skip = False
            continue
        if word in ("-r", "--requirement", "-c", "--constraint", "--index-url", "-i", "-d", "--dest"):
            skip = True
            continue
        if word.startswith("-") and word != "-e":
            continue
        if word != "-e":
            out.append(word.strip("'\""))
    return out


def test_the_distribution_is_not_named_like_the_other_pypi_project() -> None:
    assert PYPROJECT["project"]["name"] == "agentd-supervisor"
    assert set(PYPROJECT["project"]["scripts"]) == {"agentd", "agentctl"}


def test_every_install_line_installs_the_checkout_with_extras_that_exist() -> None:
    seen = 0
    for path in _doc_files():
        for m in INSTALL.finditer(path.read_text()):
            for target in _targets(m.group(1)):
                seen += 1
                name, _, extras = target.partition("[")
                where = f"{path.relative_to(REPO)}: {m.group(0).strip()!r}"
                # The project itself is always `.` (the checkout); other packages are fine
                # (a runtime's SDK), but never a name that means this project on PyPI.
                assert name not in ("agentd", "agentd-supervisor"), where
                if name == ".":
                    wanted = {e.strip() for e in extras.rstrip("]").split(",") if e.strip()}
                    assert wanted <= EXTRAS, f"{where}: no extra {sorted(wanted - EXTRAS)}"
    assert seen >= 4  # the quick start, the tests, pipx, the provider pages
    readme = (REPO / "README.md").read_text()
    assert "pipx install ." in readme
