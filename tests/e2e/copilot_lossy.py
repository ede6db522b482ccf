"""Run the real Copilot CLI behind a transport that loses chosen session events.

``python copilot_lossy.py REAL_CLI ARGS...`` starts ``REAL_CLI ARGS...`` and relays its
stdio: everything the SDK writes goes to the CLI unchanged; of what the CLI writes
(JSON-RPC frames with ``Content-Length`` headers), the ``session.event`` notifications whose
event type is listed in ``$LOSSY_DROP`` (comma-separated, e.g. ``session.idle``) are dropped.
Each drop appends the type to ``$LOSSY_LOG`` when set. The CLI dies with this process
(parent-death signal). Standard library only.

The CLI stays real: only the delivery of an event it does not persist is lost, as a
reconnect or a bug in the CLI's event stream loses it.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _pump_in(child: subprocess.Popen[bytes]) -> None:
    assert child.stdin is not None
    while True:
        data = os.read(0, 65536)
        if not data:
            child.stdin.close()
            return
        child.stdin.write(data)
        child.stdin.flush()


def main() -> int:
    drop = {t for t in os.environ.get("LOSSY_DROP", "").split(",") if t}
    log = os.environ.get("LOSSY_LOG", "")
    child = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=_die_with_parent)
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    threading.Thread(target=_pump_in, args=(child,), daemon=True).start()
    src, out = child.stdout, sys.stdout.buffer
    assert src is not None
    while True:
        headers = b""
        while not headers.endswith(b"\r\n\r\n"):
            byte = src.read(1)
            if not byte:
                return child.wait()
            headers += byte
        length = next(int(line.split(b":", 1)[1]) for line in headers.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        body = src.read(length)
        try:
            msg = json.loads(body)
        except ValueError:
            msg = {}
        event = (msg.get("params") or {}).get("event") if msg.get("method") == "session.event" else None
        if isinstance(event, dict) and event.get("type") in drop:
            if log:
                with open(log, "a") as f:
                    f.write(event["type"] + "\n")
            continue
        out.write(headers + body)
        out.flush()


if __name__ == "__main__":
    sys.exit(main())
