"""Conformance column ``set_model``: after ``agentctl set-model``, the next model request the
runtime sends names the new model (and the effort, where the wire carries it).

The new model comes from the provider's own catalog (``agentctl models P --json``), the way a
user picks one; asking for the catalog also lets an ACP agent say what it offers before its
capabilities are read. The model request is what the scripted model server received (its path
and body); for the script provider, which has no model, the line ``received.jsonl`` gets with
each prompt (the model, effort and context tier it played the turn with).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conformance import _json, _new, _supported
from daemon_harness import Daemon
from runtimes_e2e import Runtime

pytestmark = pytest.mark.e2e

#: scenario -> the capabilities it needs
SCENARIOS: dict[str, tuple[str, ...]] = {
    "set_model": ("models", "set_model"),
}

SWITCHED = 'model = "switched"\n[[models]]\nid = "switched"\nefforts = ["low", "high"]\n[[turn]]\n[[turn.step]]\nkind = "text"\ntext = "switched"\n'


_ENDPOINTS = ("/responses", "/chat/completions", "/messages", "GenerateContent")


def _model_calls(runtime: Runtime, *, tools: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of each model call the server got; ``tools``: only those offering tools (the
    conversation's own, not a runtime's title or routing calls)."""
    assert runtime.server is not None
    return [(path, body) for _, path, body in list(runtime.server.calls)
            if isinstance(body, dict) and path.endswith(_ENDPOINTS) and (body.get("tools") or not tools)]


def _named(path: str, body: dict[str, Any]) -> str:
    """The model a request names: its body's ``model``, else (Gemini) the path's ``models/<id>:``."""
    if body.get("model"):
        return str(body["model"])
    if "/models/" in path:
        return path.split("/models/", 1)[1].split(":", 1)[0]
    return ""


def _effort_on_wire(body: dict[str, Any]) -> str | None:
    """The reasoning effort a request carries, where its wire has a field for it (Responses API,
    Chat Completions, Anthropic Messages' output_config); None where it has none."""
    for value in ((body.get("reasoning") or {}).get("effort"), body.get("reasoning_effort"),
                  (body.get("output_config") or {}).get("effort")):
        if value:
            return str(value)
    return None


def _pick(models: list[dict[str, Any]], current: str) -> tuple[str, str]:
    """Another model than ``current`` from the catalog, with an effort it lists (or "")."""
    # Not a meta model the runtime resolves itself (Claude Code's "default", Gemini's "auto-..." router).
    others = [m for m in models if m["id"] != current and m["id"] != "default" and "auto" not in m["id"]] or models
    with_effort = [m for m in others if m["efforts"]]
    chosen = (with_effort or others)[0]
    efforts = chosen["efforts"]
    return chosen["id"], ("high" if "high" in efforts else efforts[0]) if efforts else ""


def _turn(d: Daemon, cid: str, text: str) -> None:
    done = d.agentctl("send", cid, text, "--follow", "--json", timeout=180)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"


@pytest.mark.parametrize("scenario", ["set_model"])
def test_set_model_names_the_new_model_in_the_next_model_request(
    runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest
) -> None:
    listed = daemon.agentctl("models", runtime.provider, "--json", timeout=120)
    if not _supported(daemon, runtime, scenario, request):
        return
    runtime.text_only("Before the switch.")
    cid = _new(daemon, runtime, workdir, scenario)
    _turn(daemon, cid, "first")
    if runtime.provider == "script":
        switched = workdir.parent / "switched.toml"
        switched.write_text(SWITCHED)
        assert daemon.agentctl("set-model", cid, str(switched), "--effort", "high").returncode == 0
        _turn(daemon, cid, "second")
        lines = [json.loads(x) for x in (daemon.state_dir / "providers" / "script" / "received.jsonl").read_text().splitlines()]
        last = [x for x in lines if x["conversation"] == _json(daemon.agentctl("show", cid, "--json"))["record"]["provider_conversation_id"]][-1]
        assert (last["text"], last.get("model"), last.get("effort")) == ("second", "switched", "high"), last
        return
    models = _json(listed)["models"]
    before = _model_calls(runtime)
    assert before, "the first turn sent no model request"
    current = _named(*before[-1])
    model, effort = _pick(models, current)
    assert model != current, f"{runtime.name}: the catalog offers no model besides {current!r}: {models}"
    args = ["set-model", cid, model] + (["--effort", effort] if effort else [])
    chosen = daemon.agentctl(*args)
    if chosen.returncode != 0 and effort:  # the runtime takes no effort for it: the model alone
        request.node.user_properties.append(("note", f"effort refused: {chosen.stderr.strip()[:80]}"))
        effort = ""
        chosen = daemon.agentctl("set-model", cid, model)
    assert chosen.returncode == 0, chosen.stderr
    runtime.text_only("After the switch.")
    seen, seen_all = len(_model_calls(runtime)), len(_model_calls(runtime, tools=False))
    _turn(daemon, cid, "second")
    # Codex sends no tools to some catalog models: then the turn's one model call is the request.
    after = _model_calls(runtime)[seen:] or _model_calls(runtime, tools=False)[seen_all:]
    assert after, "the turn after set-model sent no model request"
    path, body = after[0]
    named = _named(path, body)
    # A runtime may resolve an alias (Claude Code: haiku -> claude-haiku-4-5-...): the id is in the name.
    assert model.split("[")[0] in named, f"asked for {model!r}, the runtime sent {named!r}"
    wire_effort = _effort_on_wire(body)
    if effort and wire_effort is not None:
        assert wire_effort == effort, f"asked for effort {effort!r}, the runtime sent {wire_effort!r}"
    elif effort:
        request.node.user_properties.append(("note", "effort not on the wire"))
    assert _json(daemon.agentctl("show", cid, "--json"))["record"]["model"] == model
