"""Fixtures for end-to-end tests against real agent runtimes.

Reusable by any e2e test (provider level or through the daemon and agentctl):

* ``copilot_cli`` (session) -> ``str``: path of the real Copilot CLI binary,
  installed from ``tests/e2e/package-lock.json`` with ``npm ci`` when
  ``node_modules`` lacks it. Skips (with the reason) only when npm is missing
  or cannot install it.
* ``model_server`` -> :class:`modelserver.ModelServer`: the scripted
  OpenAI-compatible model server on 127.0.0.1 (``.url``, ``.requests``,
  ``.model_requests``, mode setters such as ``answer_text_only()``,
  ``call_tool()``, ``stream_slowly()``, ``fail_with()``, ``drop_stream()``).
  Every request body is also logged to ``<tmp_path>/model-requests.jsonl``.
* ``copilot_home`` -> ``Path``: an empty COPILOT_HOME for the test.
* ``model_key_env`` -> ``str``: the NAME of an environment variable holding
  a dummy API key (set for the test), for ``byok.api_key_env``.
* ``copilot_config`` -> ``CopilotConfig``: bring-your-own-key (openai,
  completions) pointing at ``model_server``, with ``copilot_cli`` and
  ``copilot_home``. ``copilot_byok_toml`` renders the same as an
  ``agentd.toml`` fragment for daemon-level tests.
* ``workdir`` -> ``Path``: an empty working directory for conversations.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from modelserver import ModelServer  # noqa: E402

MODEL = "scripted-model"
KEY_ENV = "AGENTD_E2E_MODEL_KEY"


def _native_cli(root: pathlib.Path) -> pathlib.Path | None:
    """The platform binary of @github/copilot under ``root/node_modules``, or None."""
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower(), platform.machine())
    plats = {"linux": ["linux", "linuxmusl"], "darwin": ["darwin"], "win32": ["win32"]}.get(sys.platform, [sys.platform])
    for plat in plats:
        exe = root / "node_modules" / "@github" / f"copilot-{plat}-{arch}" / ("copilot.exe" if sys.platform == "win32" else "copilot")
        if exe.is_file() and os.access(exe, os.X_OK):
            return exe
    return None


def install_copilot_cli(root: pathlib.Path = HERE) -> pathlib.Path:
    """The installed CLI binary, running ``npm ci`` in ``root`` first when needed.

    Raises RuntimeError (with npm's output) when npm is missing or fails.
    """
    exe = _native_cli(root)
    if exe is not None:
        return exe
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed, so the Copilot CLI (npm @github/copilot) cannot be installed")
    proc = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"`npm ci` in {root} failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}")
    exe = _native_cli(root)
    if exe is None:
        raise RuntimeError(f"`npm ci` in {root} installed no Copilot CLI binary for {sys.platform}/{platform.machine()}")
    return exe


@pytest.fixture(scope="session")
def copilot_cli() -> str:
    try:
        return str(install_copilot_cli())
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        reason = f"the Copilot CLI could not be installed: {exc}"
        print(f"\nSKIP: {reason}", file=sys.stderr)
        pytest.skip(reason)


@pytest.fixture
def model_server(tmp_path: pathlib.Path):
    server = ModelServer(tmp_path / "model-requests.jsonl", model=MODEL)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def copilot_home(tmp_path: pathlib.Path) -> pathlib.Path:
    home = tmp_path / "copilot-home"
    home.mkdir()
    return home


@pytest.fixture
def workdir(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def model_key_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, "sk-agentd-e2e-dummy-key")
    return KEY_ENV


@pytest.fixture
def copilot_config(copilot_cli: str, model_server: ModelServer, copilot_home: pathlib.Path, model_key_env: str):
    from agentd.config import ByokConfig, CopilotConfig

    return CopilotConfig(
        cli_path=copilot_cli,
        copilot_home=str(copilot_home),
        byok=ByokConfig(type="openai", base_url=model_server.url, api_key_env=model_key_env, model=MODEL),
    )


@pytest.fixture
def copilot_byok_toml(copilot_cli: str, model_server: ModelServer, copilot_home: pathlib.Path, model_key_env: str) -> str:
    """The ``[providers.copilot]`` tables of an agentd.toml equal to ``copilot_config``."""
    q = json.dumps  # a JSON string is a valid TOML basic string
    return (
        "[providers.copilot]\n"
        f"cli_path = {q(copilot_cli)}\n"
        f"copilot_home = {q(str(copilot_home))}\n"
        "\n[providers.copilot.byok]\n"
        'type = "openai"\n'
        f"base_url = {q(model_server.url)}\n"
        f"api_key_env = {q(model_key_env)}\n"
        f"model = {q(MODEL)}\n"
    )


# --------------------------------------------------------------------------- conformance matrix

MATRIX_FILE = HERE / "conformance-matrix.md"
_matrix: dict[tuple[str, str], str] = {}
_notes: dict[tuple[str, str], set[str]] = {}
_RANK = {"pass": 0, "unsupported": 1, "skipped": 2, "fail": 3}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "runtime" not in params or "scenario" not in params:
        return
    if report.when != "call" and not (report.skipped or report.failed):
        return
    if report.skipped:
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        result = "unsupported" if "unsupported:" in reason else "skipped"
    elif report.failed:
        result = "fail"
    else:
        notes = [value for name, value in item.user_properties if name == "note"]
        result = "pass"
        if notes:
            _notes.setdefault((params["runtime"], params["scenario"]), set()).update(notes)
    key = (params["runtime"], params["scenario"])
    if _RANK[result] >= _RANK.get(_matrix.get(key, "pass"), 0) or key not in _matrix:
        _matrix[key] = result  # a scenario with variants shows its worst


def pytest_terminal_summary(terminalreporter):
    if not _matrix:
        return
    from runtimes_e2e import RUNTIMES

    scenarios = list(dict.fromkeys(s for _, s in sorted(_matrix, key=lambda k: list(_matrix).index(k))))
    runtimes = [r for r in RUNTIMES if any(k[0] == r for k in _matrix)]
    lines = ["| runtime | " + " | ".join(scenarios) + " |", "| --- |" + " --- |" * len(scenarios)]
    for rt in runtimes:
        cells = []
        for s in scenarios:
            cell = _matrix.get((rt, s), "-")
            if cell == "pass" and (rt, s) in _notes:
                cell = "pass*"
            cells.append(cell)
        lines.append(f"| {rt} | " + " | ".join(cells) + " |")
    notes = sorted({f"* {rt} {s}: {n}" for (rt, s), ns in _notes.items() for n in ns})
    table = "\n".join(lines + ([""] + notes if notes else []))
    terminalreporter.write_sep("=", "conformance matrix (runtime x scenario)")
    terminalreporter.write_line(table)
    MATRIX_FILE.write_text(table + "\n")
