"""Files sent with a prompt: checked, stored under the conversation, swept after a while.

A file arrives base64-encoded inside the ``send`` request. The daemon decodes
it, bounds it (``[attachments] max_bytes``, ``max_files``), decides its MIME
type itself from the content and the name's extension (a client's claim is
never trusted), checks that type against ``allowed_types``, and stores it as
``<state_dir>/conversations/<id>/attachments/<sha256 prefix>-<name>``, mode
0600, written atomically. The name is reduced to one plain path component
first; a name that tries to climb or name a directory is refused. Nothing
outside a conversation's own ``attachments`` directory is ever read, written
or deleted through this module.

:func:`sweep` deletes stored files older than ``retention_days``; the daemon
runs it at start-up and daily (:func:`retention_loop`).

Blocking file I/O: callers on the trio thread run :func:`store` and
:func:`sweep` in a worker thread.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import mimetypes
import os
import re
import stat
import time
import unicodedata
from collections.abc import Sequence
from pathlib import Path

from . import _fsutil
from .contract import Attachment, Invalid
from .wire import attachment_over_limit

__all__ = ["ATTACHMENTS_DIR", "clean_name", "decode", "is_allowed", "sniff_mime", "store", "sweep"]

#: The directory under a conversation's directory that holds its uploads.
ATTACHMENTS_DIR = "attachments"
#: Hex digits of the content's sha256 that prefix a stored name (and are the attachment's id).
ID_DIGITS = 16
MAX_NAME_CHARS = 100
#: ... and at most this many bytes in UTF-8: the stored name (id, "-", name) and its temporary
#: name while written (about 40 bytes more) stay within the 255 bytes a file name may have.
MAX_NAME_BYTES = 200

_MAGIC: list[tuple[bytes, int, str]] = [
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"%PDF-", 0, "application/pdf"),
]
#: Types whose content has a signature: a name claiming one without it is refused.
_SIGNED = {"image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf"}
#: Non-``text/`` types that are text, kept as they are when the content is text.
_TEXTUAL = {
    "application/json", "application/xml", "application/javascript", "application/x-sh",
    "application/toml", "application/yaml", "application/x-yaml", "application/sql", "image/svg+xml",
}
_UNSAFE_CHARS = re.compile(r"[^\w.+()\[\] -]", re.UNICODE)


def clean_name(name: str) -> str:
    """``name`` as one safe path component: printable, no separator, no leading dot, at most 100
    characters and 200 bytes (cut in its stem, its extension kept).

    Raises :class:`Invalid` for a name that names a path (``/``, ``\\``,
    ``..``, a NUL) or nothing at all; other odd characters become ``_``.
    """
    if not name.strip():
        raise Invalid("an attachment needs a file name")
    if "\x00" in name or "/" in name or "\\" in name or name.strip() in (".", ".."):
        raise Invalid(f"attachment name {name!r} is not a plain file name (no directories, no '..')")
    text = unicodedata.normalize("NFC", name)
    text = "".join(ch if unicodedata.category(ch)[0] != "C" else "_" for ch in text)
    text = _UNSAFE_CHARS.sub("_", text).strip(" ")
    text = text.lstrip(".") or "file"
    if len(text) > MAX_NAME_CHARS or len(text.encode()) > MAX_NAME_BYTES:
        stem, dot, ext = text.rpartition(".")
        if not (dot and stem and 0 < len(ext) <= 10):
            stem, ext = text, ""
        tail = "." + ext if ext else ""
        stem = stem[: MAX_NAME_CHARS - len(tail)]
        # Cut on a character boundary: what is left of a character cut in two is dropped.
        stem = stem.encode()[: MAX_NAME_BYTES - len(tail.encode())].decode("utf-8", "ignore")
        text = stem + tail
    return text


def _is_text(data: bytes) -> bool:
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def sniff_mime(name: str, data: bytes) -> str:
    """The MIME type of ``data`` named ``name``: its signature first, then its extension and whether it is text.

    Raises :class:`Invalid` when the extension names a signed format
    (PNG, JPEG, GIF, WebP, PDF) the content does not have.
    """
    head = data[:16]
    sniffed = next((mime for magic, at, mime in _MAGIC if head[at:at + len(magic)] == magic), None)
    if sniffed is None and head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        sniffed = "image/webp"
    if sniffed:
        return sniffed
    by_name = mimetypes.guess_type(name, strict=False)[0]
    if by_name in _SIGNED:
        raise Invalid(f"attachment {name!r} is named as {by_name} but its content is not")
    if _is_text(data):
        if by_name and (by_name.startswith("text/") or by_name in _TEXTUAL):
            return by_name
        return "text/plain"
    if by_name and not by_name.startswith("text/") and by_name not in _TEXTUAL:
        return by_name
    return "application/octet-stream"


def is_allowed(mime: str, allowed: Sequence[str]) -> bool:
    """Whether ``mime`` matches one of ``allowed`` (``type/subtype``, ``type/*`` or ``*/*``); empty = any."""
    if not allowed:
        return True
    major = mime.split("/", 1)[0]
    for pattern in allowed:
        p = pattern.strip().lower()
        if p in ("*", "*/*") or p == mime or (p.endswith("/*") and p[:-2] == major):
            return True
    return False


def decode(name: str, data_b64: str, *, max_bytes: int) -> bytes:
    """The bytes of a base64 upload; :class:`LimitExceeded` past ``max_bytes``, :class:`Invalid` if not base64."""
    size = len(data_b64) // 4 * 3 - len(data_b64[-2:]) + len(data_b64[-2:].rstrip("="))
    if size > max_bytes:  # refused before decoding: the size follows from the length
        raise attachment_over_limit(name, size, max_bytes)
    try:
        data = base64.b64decode(data_b64, validate=True)
    except (binascii.Error, ValueError):
        raise Invalid(f"attachment {name!r}: its data is not valid base64") from None
    if len(data) > max_bytes:
        raise attachment_over_limit(name, len(data), max_bytes)
    return data


def _attachments_dir(conversation_dir: Path) -> Path:
    """``<conversation_dir>/attachments``, created 0700; refuses one that is not a plain directory."""
    d = conversation_dir / ATTACHMENTS_DIR
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        _fsutil.make_dirs(d)
        return d
    if not stat.S_ISDIR(st.st_mode):
        raise Invalid(f"{d} is not a directory; refusing to store attachments through it")
    return d


def store(conversation_dir: Path, name: str, data: bytes, *, mime: str = "",
          allowed_types: Sequence[str] = ()) -> Attachment:
    """Store one decoded upload; returns its :class:`Attachment` with ``path`` set.

    ``mime`` empty = sniffed here (:func:`sniff_mime`). Raises
    :class:`Invalid` for a bad name or a type not in ``allowed_types``, and
    OSError. The same content under the same name is stored once.
    """
    clean = clean_name(name)
    mime = mime or sniff_mime(clean, data)
    if not is_allowed(mime, allowed_types):
        raise Invalid(
            f"attachment {clean!r} is {mime}, which is not allowed ([attachments] allowed_types: "
            f"{', '.join(allowed_types)})",
            details={"name": clean, "mime": mime},
        )
    digest = hashlib.sha256(data).hexdigest()[:ID_DIGITS]
    d = _attachments_dir(conversation_dir)
    path = d / f"{digest}-{clean}"
    if path.parent != d or os.path.sep in path.name:  # pragma: no cover - clean_name makes this impossible
        raise Invalid(f"attachment name {name!r} is not a plain file name")
    _fsutil.atomic_write(path, data)
    return Attachment(name=clean, mime=mime, size=len(data), id=digest, path=str(path))


def sweep(conversations_dir: Path, retention_days: float, *, now: float | None = None) -> int:
    """Delete stored attachments older than ``retention_days`` (by modification time); 0 = keep forever.

    Looks only at regular files directly inside ``<conversations_dir>/*/attachments``
    (never following a symbolic link) and returns how many it deleted.
    """
    if retention_days <= 0:
        return 0
    cutoff = (time.time() if now is None else now) - retention_days * 86400
    removed = 0
    try:
        conversations = list(os.scandir(conversations_dir))
    except FileNotFoundError:
        return 0
    for conv in conversations:
        if not _fsutil.is_safe_name(conv.name) or not conv.is_dir(follow_symlinks=False):
            continue
        d = os.path.join(conv.path, ATTACHMENTS_DIR)
        try:
            if not stat.S_ISDIR(os.lstat(d).st_mode):
                continue
            entries = list(os.scandir(d))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
                    os.unlink(e.path)
                    removed += 1
            except FileNotFoundError:
                continue
    return removed
