"""Fixtures for end-to-end tests against real agent runtimes.

Reusable by any e2e test (provider level or through the daemon and agentctl):

* ``copilot_cli`` (session) -> ``str``: path of the real Copilot CLI binary,
  installed from ``tests/e2e/package-lock.json`` with ``npm ci`` when
  ``node_modules`` lacks it (installs.py: one process at a time, under a file
  lock, as the tests run in parallel). Skips (with the reason) only when npm is
  missing or cannot install it.
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
from collections.abc import Iterator
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from environment import unavailable  # noqa: E402
from installs import install_copilot_cli  # noqa: E402  (tests/bench imports it from here too)
from modelserver import ModelServer  # noqa: E402
from daemon_harness import Daemon  # noqa: E402
from runtimes_e2e import RUNTIMES, Runtime, runtime_profile  # noqa: E402

MODEL = "scripted-model"
KEY_ENV = "AGENTD_E2E_MODEL_KEY"


@pytest.fixture(scope="session")
def copilot_cli() -> str:
    try:
        return str(install_copilot_cli())
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        unavailable(f"the Copilot CLI could not be installed: {exc}")


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


# --------------------------------------------------------------------------- conformance fixtures
#
# A runtime and its daemon are started once per conformance module on a worker and shared by
# that module's cells (a daemon and a runtime take seconds to start; a cell's turn often less).
# Each cell gets a fresh view of them (:func:`daemon`): the model server back to its default
# answers with no requests remembered, the daemon's log read from the cell's start, and every
# conversation the cell opened closed at its end. A cell that kills or restarts the daemon or its
# runtime processes, or needs a daemon that never ran anything, is marked ``own_daemon`` and
# gets a daemon of its own. ``--dist loadgroup`` (pyproject.toml) keeps a module's cells of one
# runtime on one worker (:func:`pytest_collection_modifyitems`).


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "own_daemon: the conformance cell gets a daemon of its own, not the module's shared one")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group each module's shared-daemon cells of one runtime (``xdist_group``) so that they run
    on one worker and share its daemon; an ``own_daemon`` cell is scheduled on its own."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "runtime" in params and "daemon" in item.fixturenames and not item.get_closest_marker("own_daemon"):
            item.add_marker(pytest.mark.xdist_group(f"{item.path.stem}:{params['runtime']}"))


@pytest.fixture(scope="module", params=RUNTIMES)
def runtime(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """The conformance cells' runtime (one per name in RUNTIMES), with its model server; one per module."""
    root = tmp_path_factory.mktemp(request.param.replace(":", "-"))
    with runtime_profile(request.param, root) as rt:
        yield rt


@pytest.fixture(scope="module")
def daemon_config(runtime: Runtime) -> str:
    """The agentd.toml of the module's daemons; a module overrides it to add tables."""
    return runtime.config_toml


@pytest.fixture(scope="module")
def shared_daemon(runtime: Runtime, daemon_config: str) -> Iterator[Daemon]:
    """A real agentd configured for ``runtime``, shared by the module's cells, stopped after the module."""
    root = runtime.root / "daemon"
    root.mkdir()
    d = Daemon(root, daemon_config, env=runtime.env).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def daemon(request: pytest.FixtureRequest, runtime: Runtime, daemon_config: str, tmp_path: pathlib.Path) -> Iterator[Daemon]:
    """The cell's real agentd: the module's shared one, or (``own_daemon``) one of its own stopped after it."""
    runtime.new_cell()
    if request.node.get_closest_marker("own_daemon"):
        d = Daemon(tmp_path, daemon_config, env=runtime.env).start()
        try:
            yield d
        finally:
            d.stop()
        return
    d = request.getfixturevalue("shared_daemon")
    if d.proc is None or d.proc.poll() is not None:  # it died in an earlier cell (that cell failed)
        d.start()
    d.mark_log()
    yield d
    d.close_all()


# --------------------------------------------------------------------------- conformance matrix

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A conformance test's report carries its matrix cell (``report.conformance``).

    The cell travels with the report (to the controlling process under
    pytest-xdist); tests/conftest.py builds the matrix from the reports, prints
    it at the end of the run and writes it to conformance-matrix.md.
    """
    outcome = yield
    report = outcome.get_result()
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "runtime" not in params or "scenario" not in params:
        return
    if report.when != "call" and not (report.skipped or report.failed):
        return
    notes: list[str] = []
    if report.skipped:
        result = "skipped"
    elif report.failed:
        result = "fail"
    elif any(name == "unsupported" for name, _ in item.user_properties):
        result = "unsupported"  # the runtime reports the scenario's capability false (checked)
    else:
        notes = sorted({value for name, value in item.user_properties if name == "note"})
        result = "pass"
    from runtimes_e2e import RUNTIMES

    runtime, scenario = params["runtime"], params["scenario"]
    scenarios = conformance_columns()
    order = [RUNTIMES.index(runtime) if runtime in RUNTIMES else len(RUNTIMES),
             scenarios.index(scenario) if scenario in scenarios else len(scenarios)]
    report.conformance = {"runtime": runtime, "scenario": scenario, "result": result, "notes": notes, "order": order,
                          "cells": len(RUNTIMES) * len(scenarios)}


def conformance_columns() -> list[str]:
    """Every conformance scenario, in column order: ``test_conformance.py``'s first, then the
    other ``test_conformance_*.py`` modules' (each a ``SCENARIOS`` dict) by module name.

    Every xdist worker collects every module, so the columns are the same on all of them.
    """
    import importlib

    # Every module on disk, collected or not: a run of one module is then a partial matrix
    # (tests/conftest.py keeps conformance-matrix.md as it was) and never a whole one.
    names = sorted((p.stem for p in pathlib.Path(__file__).parent.glob("test_conformance*.py")),
                   key=lambda name: (name != "test_conformance", name))
    columns: list[str] = []
    for name in names:
        for scenario in getattr(importlib.import_module(name), "SCENARIOS", {}):
            if scenario not in columns:
                columns.append(scenario)
    return columns
