"""A local stand-in of the GitHub endpoints the Copilot CLI signs in through, on 127.0.0.1.

``copilot login --device-code --host http://127.0.0.1:PORT`` (and a runtime whose
``COPILOT_GH_HOST`` names the same URL) asks it for a device code
(``POST /login/device/code``), polls for the token (``POST /login/oauth/access_token``:
``authorization_pending`` until :meth:`GitHubStandIn.approve`), then reads the user
(``GET /copilot_internal/user``, which carries the quota snapshots). Every request is kept in
``requests`` as (method, path). Standard library only.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CODE = "ABCD-1234"
TOKEN = "gho_agentd_standin_token_0123456789"
LOGIN = "standin-user"
#: the catalog the stand-in's Copilot API serves, in its shape
MODELS = [
    {"id": "standin-large", "name": "Stand-in Large", "object": "model", "vendor": "agentd", "version": "1",
     "model_picker_enabled": True, "preview": False,
     "capabilities": {"family": "standin", "type": "chat", "object": "model_capabilities",
                      "limits": {"max_context_window_tokens": 400000, "max_prompt_tokens": 272000, "max_output_tokens": 32000},
                      "supports": {"streaming": True, "tool_calls": True, "parallel_tool_calls": True,
                                   "reasoning_effort": ["low", "medium", "high"]}},
     "policy": {"state": "enabled", "terms": ""}, "billing": {"is_premium": True, "multiplier": 3}},
    {"id": "standin-small", "name": "Stand-in Small", "object": "model", "vendor": "agentd", "version": "1",
     "model_picker_enabled": True, "preview": False,
     "capabilities": {"family": "standin-small", "type": "chat", "object": "model_capabilities",
                      "limits": {"max_context_window_tokens": 128000, "max_prompt_tokens": 64000, "max_output_tokens": 16000},
                      "supports": {"streaming": True, "tool_calls": True}},
     "policy": {"state": "enabled", "terms": ""}, "billing": {"is_premium": False, "multiplier": 0}},
]


class GitHubStandIn:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.approved = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_port}"

    def approve(self) -> None:
        """The person entered the code: the next poll gets the token."""
        self.approved.set()

    def start(self) -> "GitHubStandIn":
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

            def _answer(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                if n:
                    self.rfile.read(n)
                path = self.path.split("?")[0]
                owner.requests.append((self.command, path))
                if path.endswith("/login/device/code"):
                    body: Any = {"device_code": "dc-1", "user_code": CODE, "verification_uri": f"{owner.url}/login/device",
                                 "expires_in": 900, "interval": 1}
                elif path.endswith("/login/oauth/access_token"):
                    body = ({"access_token": TOKEN, "token_type": "bearer", "scope": "read:user"} if owner.approved.is_set()
                            else {"error": "authorization_pending"})
                elif path.endswith("/models"):  # Copilot's API (the user's endpoints.api): the model catalog
                    body = {"data": MODELS, "object": "list"}
                elif path.endswith(("/copilot_internal/user", "/user")):
                    body = {"login": LOGIN, "copilot_plan": "individual", "quota_reset_date": "2027-01-01",
                            "endpoints": {"api": owner.url},
                            "quota_snapshots": {"premium_interactions": {
                                "entitlement": 300, "remaining": 240, "percent_remaining": 80.0, "unlimited": False,
                                "overage_count": 0, "overage_permitted": False, "quota_id": "premium_interactions"}}}
                else:
                    self._send(404, {"message": "Not Found"})
                    return
                self._send(200, body)

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
