"""A scripted, OpenAI-compatible model server for end-to-end tests of real runtimes.

The model is the only thing an end-to-end test fakes. This server answers from
the request alone, so any runtime pointed at it (Copilot CLI with a
bring-your-own-key provider, Codex, ...) completes real turns offline:

* the request offers no tools (title and other utility calls) -> plain text;
* the last message is a tool result -> the final text answer;
* otherwise -> exactly one call of a tool the request offers: ``tool`` when
  set and offered, else ``bash``, else the first tool offered.

It speaks ``POST /v1/chat/completions`` (streamed as SSE when the request says
``stream: true``, else one JSON body), ``POST /v1/responses`` (the Responses
API, streamed) and ``POST /v1/messages`` (the Anthropic Messages API, streamed
as SSE or one JSON body; ``/v1/messages/count_tokens`` too), and answers
``GET /v1/models``. For Anthropic the shell tool is ``Bash`` (matched like
``bash``), a tool result is a ``tool_result`` block in the last user message,
and :meth:`ModelServer.think` adds a thinking block (Messages) or a reasoning summary (Responses)
before each answer. Every request body is kept,
parsed, in :attr:`ModelServer.requests` and appended as one JSON line to
:attr:`ModelServer.log_path`, so a test can assert on what the runtime sent.

Per test, the behaviour can be changed at any time (the next request sees it):
:meth:`ModelServer.stream_slowly`, :meth:`ModelServer.fail_with`,
:meth:`ModelServer.drop_stream`, :meth:`ModelServer.answer_text_only`,
:meth:`ModelServer.reset`.

The server runs in a thread of its own on 127.0.0.1 with an ephemeral port,
so it serves a runtime driven from trio, asyncio or another process alike::

    with ModelServer(log_path) as server:
        ...  # point the runtime at server.url ("http://127.0.0.1:PORT/v1")

Standard library only.
"""

from __future__ import annotations

import json
import pathlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_TEXT = "Hello from the scripted model. This answer streams in small pieces."
DEFAULT_FINAL_TEXT = "The command ran; its output is above."
DEFAULT_COMMAND = "echo scripted-tool-call"


class ModelServer:
    """The scripted model server; see the module docstring for what it answers."""

    def __init__(self, log_path: str | pathlib.Path | None = None, *, model: str = "scripted-model") -> None:
        self.model = model
        self.log_path = pathlib.Path(log_path) if log_path else None
        self.requests: list[dict[str, Any]] = []
        #: every request as (method, path, parsed body or None), in arrival order
        self.calls: list[tuple[str, str, Any]] = []
        #: each POST's Authorization header ("" when absent), in arrival order
        self.authorizations: list[str] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.reset()

    # ------------------------------------------------------------------ modes

    def reset(self) -> None:
        """Back to the default behaviour: fast streams, no failures, tools called."""
        #: text of a plain answer (no tools offered, or tools turned off)
        self.text = DEFAULT_TEXT
        #: text of the answer after a tool result
        self.final_text = DEFAULT_FINAL_TEXT
        #: the shell command of a ``bash`` call
        self.command = DEFAULT_COMMAND
        #: name of the tool to call when the request offers it (else bash, else the first)
        self.tool = ""
        #: arguments for a tool other than bash (JSON object); bash gets command+description
        self.tool_arguments: dict[str, Any] | None = None
        #: the id of every tool call ("" = a new random one each time; set one to make the runtime reuse it)
        self.call_id = ""
        #: call a tool when the request offers some; False answers text only
        self.use_tools = True
        #: seconds to sleep before each streamed chunk
        self.chunk_delay = 0.0
        #: answer every model request with this HTTP status (0 = don't)
        self.fail_status = 0
        #: how many requests still fail with fail_status (None = all of them)
        self.fail_count: int | None = None
        #: seconds a failure asks the client to wait before retrying (Retry-After), None = no header
        self.retry_after: float | None = None
        #: close the connection after this many streamed chunks (None = don't)
        self.drop_after: int | None = None
        #: extra response headers of every streamed answer (an endpoint's rate-limit headers, say)
        self.stream_headers: dict[str, str] = {}
        #: a thinking block (Anthropic Messages) or reasoning summary (Responses API) streamed before
        #: each answer ("" = none)
        self.thinking = ""

    def stream_slowly(self, delay: float) -> None:
        """Sleep ``delay`` seconds before each streamed chunk."""
        self.chunk_delay = delay

    def fail_with(self, status: int = 500, *, count: int | None = None, retry_after: float | None = None) -> None:
        """Answer model requests with HTTP ``status`` (the next ``count`` ones, or all).

        ``retry_after`` adds ``Retry-After``/``retry-after-ms`` headers, which
        runtimes that honour them use instead of their own backoff.
        """
        self.fail_status = status
        self.fail_count = count
        self.retry_after = retry_after

    def stream_normally(self) -> None:
        """No more delay or drop, the scripted answer kept. Both are read per chunk, so a stream
        under way goes on whole too; :meth:`reset` would also change an answer not composed yet."""
        self.chunk_delay = 0.0
        self.drop_after = None

    def drop_stream(self, after_chunks: int = 2) -> None:
        """Close the connection mid-stream, after ``after_chunks`` chunks, with no end marker."""
        self.drop_after = after_chunks

    def think(self, text: str) -> None:
        """Stream reasoning with ``text`` before each answer: a thinking block (Anthropic Messages),
        a reasoning item with a summary (Responses API)."""
        self.thinking = text

    def answer_text_only(self, text: str | None = None) -> None:
        """Answer with plain text even when the request offers tools."""
        self.use_tools = False
        if text is not None:
            self.text = text

    def call_tool(self, name: str = "bash", *, command: str | None = None, arguments: dict[str, Any] | None = None,
                  call_id: str = "") -> None:
        """Call tool ``name`` (with ``command`` for bash, else ``arguments``) when it is offered.

        ``call_id``: the call's id, the same in every turn ("" = a new one each call)."""
        self.use_tools = True
        self.call_id = call_id
        self.tool = name
        if command is not None:
            self.command = command
        self.tool_arguments = arguments

    def forget(self) -> None:
        """Drop the requests received so far (:attr:`requests`, :attr:`calls`; the log file keeps them):
        a server shared by several tests gives each only its own."""
        with self._lock:
            self.requests.clear()
            self.calls.clear()

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """Base URL of the OpenAI-compatible API, ending in ``/v1``."""
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> ModelServer:
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="model-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ inspection

    @property
    def model_requests(self) -> list[dict[str, Any]]:
        """Request bodies that offered tools: the conversation's own model calls."""
        with self._lock:
            return [r for r in self.requests if r.get("tools")]

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Block (a thread, not an event loop) until ``count`` bodies arrived; return them all."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self.requests)} of {count} model requests arrived")
                self._changed.wait(left)
            return list(self.requests)

    def _record(self, method: str, path: str, body: Any, authorization: str = "") -> None:
        with self._changed:
            self.calls.append((method, path, body))
            if method == "POST":
                self.authorizations.append(authorization)
            if isinstance(body, dict):
                self.requests.append(body)
            if self.log_path is not None:
                with self.log_path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"method": method, "path": path, "body": body}) + "\n")
            self._changed.notify_all()

    def _take_failure(self) -> int:
        with self._lock:
            if not self.fail_status:
                return 0
            if self.fail_count is not None:
                if self.fail_count <= 0:
                    return 0
                self.fail_count -= 1
            return self.fail_status

    # ------------------------------------------------------------------ the script

    def decide(self, tools: list[dict[str, Any]], last_is_tool_result: bool) -> tuple[str, Any]:
        """What to answer: ``("text", str)`` or ``("tool", (name, arguments))``."""
        if last_is_tool_result:
            return "text", self.final_text
        if not tools or not self.use_tools:
            return "text", self.text
        names = _tool_names(tools)
        shell = next((n for n in names if n.lower() == "bash"), "")  # Claude Code calls it Bash
        name = self.tool if self.tool in names else shell or names[0]
        if name == shell and self.tool_arguments is None:
            args: dict[str, Any] = {"command": self.command, "description": "Run the scripted command"}
        else:
            args = dict(self.tool_arguments or {})
        return "tool", (name, args)


def _tool_name(tool: dict[str, Any]) -> str:
    # chat completions: {"type": "function", "function": {"name": ...}}; responses: {"type": "function", "name": ...}
    fn = tool.get("function")
    if isinstance(fn, dict) and fn.get("name"):
        return str(fn["name"])
    return str(tool.get("name", ""))


def _tool_names(tools: list[dict[str, Any]]) -> list[str]:
    """Every tool name offered; a Responses API namespace (Codex's MCP servers) gives ``<namespace>__<tool>``."""
    names: list[str] = []
    for tool in tools:
        if tool.get("type") == "namespace":
            names += [f"{tool.get('name')}__{_tool_name(t)}" for t in tool.get("tools") or []]
        else:
            names.append(_tool_name(tool))
    return names


def _namespaced(tools: list[dict[str, Any]], name: str) -> tuple[str, str]:
    """``(namespace, tool)`` of a name :func:`_tool_names` made of a namespace's tool, else ``("", name)``."""
    for tool in tools:
        if tool.get("type") == "namespace" and name.startswith(f"{tool.get('name')}__"):
            return str(tool.get("name")), name[len(str(tool.get("name"))) + 2:]
    return "", name


def _words(text: str) -> list[str]:
    parts = text.split(" ")
    return [p + (" " if i < len(parts) - 1 else "") for i, p in enumerate(parts)]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Dropped(Exception):
    """The scripted drop: the connection is cut mid-stream."""


class _Handler(BaseHTTPRequestHandler):
    owner: ModelServer
    protocol_version = "HTTP/1.1"
    #: TCP_NODELAY, as a model API's servers set it: with Nagle on, each streamed chunk after the
    #: headers waited for the client's delayed ACK (~40 ms on Linux), in most turns or only some
    #: depending on timing (a Gemini CLI turn: 59 ms median with Nagle, 13 ms without)
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        pass

    # ------------------------------------------------------------------ routing

    def do_GET(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        self.owner._record("GET", path, None)
        if path.endswith("/models"):
            self._json(200, {"object": "list", "data": [{"id": self.owner.model, "object": "model", "owned_by": "agentd-tests"}]})
        else:
            self._json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})

    def do_POST(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = {"_unparsed": raw.decode("utf-8", "replace")}
        self.owner._record("POST", path, body, self.headers.get("Authorization") or "")
        if not isinstance(body, dict):
            self._json(400, {"error": {"message": "expected a JSON object", "type": "invalid_request_error"}})
            return
        status = self.owner._take_failure()
        if status:
            headers = {}
            if self.owner.retry_after is not None:
                headers = {"Retry-After": f"{self.owner.retry_after:g}", "retry-after-ms": str(int(self.owner.retry_after * 1000))}
            message = f"scripted failure: HTTP {status}"
            if path.endswith("/messages"):  # Anthropic's error shape
                self._json(status, {"type": "error", "error": {"type": "api_error", "message": message}}, headers)
                return
            self._json(status, {"error": {"message": message, "type": "server_error", "code": "scripted"}}, headers)
            return
        try:
            if path.endswith("/chat/completions"):
                self._chat(body)
            elif path.endswith("/responses"):
                self._responses(body)
            elif path.endswith("/messages/count_tokens"):
                self._json(200, {"input_tokens": 100})
            elif path.endswith("/messages"):
                self._messages(body)
            elif path.endswith(("GenerateContent", ":generateContent")):  # Gemini: see gemini_flavour.py
                __import__("gemini_flavour").handle(self, path, body)
            else:
                self._json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
        except _Dropped:
            self._cut()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # ------------------------------------------------------------------ chat completions

    def _chat(self, body: dict[str, Any]) -> None:
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        kind, what = self.owner.decide(body.get("tools") or [], last.get("role") == "tool")
        model = body.get("model") or self.owner.model
        cid = "chatcmpl-" + uuid.uuid4().hex[:12]
        created = int(time.time())
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}

        if not body.get("stream"):
            if kind == "text":
                message: dict[str, Any] = {"role": "assistant", "content": what}
                finish = "stop"
            else:
                name, args = what
                message = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": self.owner.call_id or "call_" + uuid.uuid4().hex[:12], "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                ]}
                finish = "tool_calls"
            self._json(200, {"id": cid, "object": "chat.completion", "created": created, "model": model,
                             "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage})
            return

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        def events() -> Iterator[dict[str, Any]]:
            if kind == "text":
                yield chunk({"role": "assistant", "content": ""})
                for word in _words(what):
                    yield chunk({"content": word})
                yield chunk({}, "stop")
            else:
                name, args = what
                call_id = self.owner.call_id or "call_" + uuid.uuid4().hex[:12]
                yield chunk({"role": "assistant", "content": None, "tool_calls": [
                    {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]})
                text = json.dumps(args)
                for i in range(0, len(text), 16):
                    yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": text[i:i + 16]}}]})
                yield chunk({}, "tool_calls")
            yield {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [], "usage": usage}

        self._sse((f"data: {json.dumps(e)}\n\n" for e in events()), done="data: [DONE]\n\n")

    # ------------------------------------------------------------------ responses API

    def _responses(self, body: dict[str, Any]) -> None:
        items = body.get("input")
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        items = items or []
        last = items[-1] if items else {}
        kind, what = self.owner.decide(body.get("tools") or [], last.get("type") == "function_call_output")
        model = body.get("model") or self.owner.model
        rid = "resp_" + uuid.uuid4().hex[:12]
        usage = {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110,
                 "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
        base = {"id": rid, "object": "response", "created_at": int(time.time()), "model": model, "status": "in_progress", "output": []}
        seq = iter(range(1, 1_000_000))

        if kind == "text":
            item: dict[str, Any] = {"id": "msg_" + uuid.uuid4().hex[:12], "type": "message", "role": "assistant", "status": "completed",
                                    "content": [{"type": "output_text", "text": what, "annotations": []}]}
        else:
            name, args = what
            namespace, name = _namespaced(body.get("tools") or [], name)
            item = {"id": "fc_" + uuid.uuid4().hex[:12], "type": "function_call", "status": "completed",
                    "call_id": self.owner.call_id or "call_" + uuid.uuid4().hex[:12], "name": name, "arguments": json.dumps(args)}
            if namespace:
                item["namespace"] = namespace

        thinking = self.owner.thinking
        reasoning = {"id": "rs_" + uuid.uuid4().hex[:12], "type": "reasoning",
                     "summary": [{"type": "summary_text", "text": thinking}]} if thinking else None
        output = [reasoning, item] if reasoning else [item]
        if not body.get("stream"):
            self._json(200, {**base, "status": "completed", "output": output, "usage": usage})
            return

        def ev(type_: str, **fields: Any) -> str:
            data = {"type": type_, "sequence_number": next(seq), **fields}
            return f"event: {type_}\ndata: {json.dumps(data)}\n\n"

        def events() -> Iterator[str]:
            yield ev("response.created", response=base)
            yield ev("response.in_progress", response=base)
            at = 0
            if reasoning is not None:
                rs_id = reasoning["id"]
                yield ev("response.output_item.added", output_index=0, item={**reasoning, "summary": []})
                yield ev("response.reasoning_summary_part.added", item_id=rs_id, output_index=0, summary_index=0,
                         part={"type": "summary_text", "text": ""})
                for word in _words(thinking):
                    yield ev("response.reasoning_summary_text.delta", item_id=rs_id, output_index=0, summary_index=0, delta=word)
                yield ev("response.reasoning_summary_text.done", item_id=rs_id, output_index=0, summary_index=0, text=thinking)
                yield ev("response.reasoning_summary_part.done", item_id=rs_id, output_index=0, summary_index=0,
                         part=reasoning["summary"][0])
                yield ev("response.output_item.done", output_index=0, item=reasoning)
                at = 1
            if kind == "text":
                started = {**item, "status": "in_progress", "content": []}
                yield ev("response.output_item.added", output_index=at, item=started)
                part = {"type": "output_text", "text": "", "annotations": []}
                yield ev("response.content_part.added", item_id=item["id"], output_index=at, content_index=0, part=part)
                for word in _words(what):
                    yield ev("response.output_text.delta", item_id=item["id"], output_index=at, content_index=0, delta=word)
                yield ev("response.output_text.done", item_id=item["id"], output_index=at, content_index=0, text=what)
                yield ev("response.content_part.done", item_id=item["id"], output_index=at, content_index=0, part=item["content"][0])
            else:
                started = {**item, "status": "in_progress", "arguments": ""}
                yield ev("response.output_item.added", output_index=at, item=started)
                text = item["arguments"]
                for i in range(0, len(text), 16):
                    yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=at, delta=text[i:i + 16])
                yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=at, arguments=text)
            yield ev("response.output_item.done", output_index=at, item=item)
            yield ev("response.completed", response={**base, "status": "completed", "output": output, "usage": usage})

        self._sse(events(), done=None)

    # ------------------------------------------------------------------ Anthropic Messages API

    def _messages(self, body: dict[str, Any]) -> None:
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        content = last.get("content") if isinstance(last, dict) else None
        tool_result = last.get("role") == "user" and isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
        kind, what = self.owner.decide(body.get("tools") or [], tool_result)
        model = body.get("model") or self.owner.model
        thinking = self.owner.thinking
        mid = "msg_" + uuid.uuid4().hex[:12]
        usage = {"input_tokens": 100, "output_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        blocks: list[dict[str, Any]] = []
        if thinking:
            blocks.append({"type": "thinking", "thinking": thinking, "signature": "scripted-signature"})
        if kind == "text":
            blocks.append({"type": "text", "text": what})
            stop = "end_turn"
        else:
            name, args = what
            blocks.append({"type": "tool_use", "id": self.owner.call_id or "toolu_" + uuid.uuid4().hex[:20], "name": name, "input": args})
            stop = "tool_use"
        message = {"id": mid, "type": "message", "role": "assistant", "model": model, "content": blocks,
                   "stop_reason": stop, "stop_sequence": None, "usage": usage}

        if not body.get("stream"):
            self._json(200, message)
            return

        def ev(type_: str, **fields: Any) -> str:
            return f"event: {type_}\ndata: {json.dumps({'type': type_, **fields})}\n\n"

        def events() -> Iterator[str]:
            start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
            yield ev("message_start", message=start)
            for index, block in enumerate(blocks):
                if block["type"] == "thinking":
                    yield ev("content_block_start", index=index, content_block={"type": "thinking", "thinking": "", "signature": ""})
                    for word in _words(block["thinking"]):
                        yield ev("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": word})
                    yield ev("content_block_delta", index=index, delta={"type": "signature_delta", "signature": block["signature"]})
                elif block["type"] == "text":
                    yield ev("content_block_start", index=index, content_block={"type": "text", "text": ""})
                    for word in _words(block["text"]):
                        yield ev("content_block_delta", index=index, delta={"type": "text_delta", "text": word})
                else:
                    yield ev("content_block_start", index=index, content_block={**block, "input": {}})
                    text = json.dumps(block["input"])
                    for i in range(0, len(text), 16):
                        yield ev("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": text[i:i + 16]})
                yield ev("content_block_stop", index=index)
            yield ev("message_delta", delta={"stop_reason": stop, "stop_sequence": None}, usage={"output_tokens": usage["output_tokens"]})
            yield ev("message_stop")

        self._sse(events(), done=None)

    # ------------------------------------------------------------------ transport

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, frames: Iterator[str], *, done: str | None) -> None:
        """Stream ``frames`` as chunked SSE, honouring the delay and drop modes."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for k, v in self.owner.stream_headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.flush()
        sent = 0
        for frame in frames:
            delay = self.owner.chunk_delay
            if delay:
                time.sleep(delay)
            drop = self.owner.drop_after
            if drop is not None and sent >= drop:
                raise _Dropped
            self._chunk(frame.encode())
            sent += 1
        if done:
            self._chunk(done.encode())
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _cut(self) -> None:
        """Cut the connection with no terminating chunk: the client sees a broken stream."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


if __name__ == "__main__":  # a manual run: serve until interrupted
    import sys

    with ModelServer(sys.argv[1] if len(sys.argv) > 1 else None) as s:
        print(s.url, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
