"""The least a supervisor process between a client and a runtime does: relay its stdio, byte for byte.

Run as ``python _relay.py JOURNAL ARGV...``: starts ``ARGV`` and copies this
process's stdin to the runtime's and the runtime's stdout to this process's
stdout, as soon as each chunk arrives, until the runtime exits (its exit status
is this one's). Each chunk for the runtime is first appended to ``JOURNAL``
and fsynced, as agentd makes a prompt durable before the runtime may see it
(the journal is the durable start marker). Nothing is parsed, nothing is
fanned out, nothing is checkpointed.

The turn benchmarks drive the runtime directly through this relay as a fourth
side: the time it adds is what one more process on the path of every message
costs on this machine (its wake-ups, copies and the scheduler's share of two
cores), which no supervisor in a process of its own can go below. Standard
library only.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys


def main() -> int:
    journal_path, argv = sys.argv[1], sys.argv[2:]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert proc.stdin is not None and proc.stdout is not None
    to_runtime, from_runtime = proc.stdin.fileno(), proc.stdout.fileno()
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    journal = os.open(journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    sel = selectors.DefaultSelector()
    sel.register(stdin, selectors.EVENT_READ)
    sel.register(from_runtime, selectors.EVENT_READ)
    open_ends = 2
    while open_ends:
        for key, _ in sel.select():
            fd = key.fd
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                sel.unregister(fd)
                open_ends -= 1
                if fd == stdin:
                    proc.stdin.close()
                continue
            try:
                if fd == stdin:
                    os.write(journal, chunk)
                    os.fsync(journal)
                    _write_all(to_runtime, chunk)
                else:
                    _write_all(stdout, chunk)
            except BrokenPipeError:  # the other end went away: its EOF ends the relay
                pass
    return proc.wait()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


if __name__ == "__main__":
    sys.exit(main())
