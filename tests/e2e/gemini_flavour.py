"""The Gemini ``generateContent`` flavour of the scripted model server.

Gemini CLI (``GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:PORT``, gateway auth)
posts to ``/v1beta/models/<model>:streamGenerateContent?alt=sse`` for its
turns and to ``:generateContent`` for utility calls. It answers from the
request alone, like the other flavours (:meth:`modelserver.ModelServer.decide`):

* a request that asks for JSON (``generationConfig.responseMimeType`` is
  ``application/json``, as the model router and the next-speaker check do) ->
  one JSON object built from its ``responseJsonSchema``: the first ``enum``
  value of each property (so the router picks its first model and the
  next-speaker check says ``user``), a short string otherwise;
* the last content carries a ``functionResponse`` -> the final text;
* tools offered -> one ``functionCall`` of the tool ``decide`` picks;
* otherwise plain text, streamed a word per SSE event.

``modelserver`` routes here with :func:`handle`; standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

USAGE = {"promptTokenCount": 100, "candidatesTokenCount": 10, "totalTokenCount": 110}


def is_gemini_path(path: str) -> bool:
    """True for a ``...:generateContent`` or ``...:streamGenerateContent`` path."""
    return path.endswith(":generateContent") or path.endswith(":streamGenerateContent")


def handle(handler: Any, path: str, body: dict[str, Any]) -> None:
    """Answer one Gemini request through ``handler`` (a ``modelserver._Handler``)."""
    owner = handler.owner
    model = path.rsplit("/", 1)[-1].split(":", 1)[0] or owner.model
    stream = path.endswith(":streamGenerateContent")
    config = body.get("generationConfig") or {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    if config.get("responseMimeType") == "application/json" or schema:
        _answer(handler, stream, model, [{"text": json.dumps(_from_schema(schema or {}))}])
        return
    contents = body.get("contents") or []
    last = contents[-1] if contents else {}
    last_is_result = any(isinstance(p, dict) and "functionResponse" in p for p in last.get("parts") or [])
    tools = [
        {"name": d.get("name", "")}
        for t in body.get("tools") or []
        if isinstance(t, dict)
        for d in t.get("functionDeclarations") or []
    ]
    kind, what = owner.decide(tools, last_is_result)
    if kind == "tool":
        name, args = what
        if name != owner.tool and any(t["name"] == "run_shell_command" for t in tools):
            name, args = "run_shell_command", {}  # Gemini's shell tool stands in for bash
        if name == "run_shell_command" and "command" not in args:
            args = {"command": owner.command, "description": "Run the scripted command"}
        _answer(handler, stream, model, [{"functionCall": {"name": name, "args": args}}])
        return
    if not stream:
        _answer(handler, False, model, [{"text": what}])
        return
    words = what.split(" ")
    parts = [[{"text": w + (" " if i < len(words) - 1 else "")}] for i, w in enumerate(words)]
    handler._sse(_events(model, parts), done=None)


def _answer(handler: Any, stream: bool, model: str, parts: list[dict[str, Any]]) -> None:
    if stream:
        handler._sse(_events(model, [parts]), done=None)
    else:
        handler._json(200, _response(model, parts, final=True))


def _events(model: str, chunks: list[list[dict[str, Any]]]) -> Iterator[str]:
    for i, parts in enumerate(chunks):
        yield f"data: {json.dumps(_response(model, parts, final=i == len(chunks) - 1))}\r\n\r\n"


def _response(model: str, parts: list[dict[str, Any]], *, final: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    out: dict[str, Any] = {"candidates": [candidate], "modelVersion": model}
    if final:
        candidate["finishReason"] = "STOP"
        out["usageMetadata"] = USAGE
    return out


def _from_schema(schema: dict[str, Any]) -> Any:
    """A small value that fits a JSON schema: first enum value, else the smallest value its type allows."""
    if not isinstance(schema, dict):
        return "scripted"
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0] if kind else "string"
    kind = str(kind or ("object" if "properties" in schema else "string")).lower()
    if kind == "object":
        return {k: _from_schema(v) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)  # scores are 1-based (the router asks for 1-100)
    if kind == "boolean":
        return False
    return "scripted"
