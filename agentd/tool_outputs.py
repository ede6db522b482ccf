"""Whole tool outputs, kept beside the journal when a record carries only a display cut.

A provider bounds a tool's ``output`` for display (16 KiB or so) and says in
``ToolCall.cut`` how many UTF-8 bytes it left out; with it, it emits a
``ToolOutputEvent`` holding the whole text (up to agentd.runtime_output's
64 MiB message ceiling). The conversation service hands that here instead of
the journal:

* masked (agentd.masking), then stored as
  ``<state>/conversations/<id>/tool-output/<key>.txt`` (0600, in a 0700
  directory, written atomically), ``key`` a hash of (agent id, item id), so
  a runtime's ids never make a path;
* within ``[journal] tool_output_quota_bytes`` per conversation: the oldest
  outputs are deleted to make room; an output larger than the whole quota is
  not kept (:meth:`ToolOutputs.keep` returns False and logs it), and the record's
  cut still says what is missing;
* read back by ``agentctl show CONV --item ID --full`` (wire op ``show_item``)
  and by ``agentctl export --include-tools``, in pages of :data:`PAGE_BYTES`.

:class:`ToolOutputs` does blocking file I/O: call it from a worker thread
(:func:`show_item` does). Raises OSError only from :meth:`ToolOutputs.keep`
(the caller logs it; the turn goes on).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from typing import TYPE_CHECKING, Any

import structlog
import trio

from . import _fsutil, masking

if TYPE_CHECKING:
    from .contract import Item
    from .wire import ItemInfo

log = structlog.get_logger(__name__)

OUTPUT_DIR = "tool-output"
#: Default of ``[journal] tool_output_quota_bytes``: whole outputs kept per conversation.
DEFAULT_QUOTA_BYTES = 256 << 20
#: Largest piece of an output one ``show_item`` answer carries (a frame stays under the client's 64 MiB).
PAGE_BYTES = 16 << 20


def _key(agent_id: str, item_id: str) -> str:
    return hashlib.sha256(f"{agent_id}\0{item_id}".encode("utf-8", "surrogatepass")).hexdigest()[:40]


def _file(agent_id: str, item_id: str) -> str:
    """The name of an item's kept output in its conversation's output folder."""
    return f"{_key(agent_id, item_id)}.txt"


class ToolOutputs:
    """The kept outputs of every conversation under ``root`` (the conversations directory)."""

    def __init__(self, root: Path, quota_bytes: int = DEFAULT_QUOTA_BYTES) -> None:
        self.root = root
        self.quota_bytes = quota_bytes

    def _dir(self, conversation_id: str) -> Path:
        if not _fsutil.is_safe_name(conversation_id):
            raise ValueError(f"invalid conversation id {conversation_id!r}")
        return self.root / conversation_id / OUTPUT_DIR

    def keep(self, conversation_id: str, agent_id: str, item_id: str, text: str) -> bool:
        """Store one whole output (replacing an earlier one of the same item); False when over the quota.

        Masked first (agentd.masking), like every journal record: a secret a tool
        printed is never written, and no page read back can split one.
        """
        data = masking.mask_text(text).encode("utf-8", "replace")
        if self.quota_bytes == 0:
            return False  # keeping none, by configuration
        if len(data) > self.quota_bytes:
            log.warning("tool_output.over_quota", conversation=conversation_id, item=item_id, bytes=len(data),
                        quota=self.quota_bytes, note="only the display cut is kept ([journal] tool_output_quota_bytes)")
            return False
        d = self._made_dir(conversation_id)
        path = d / _file(agent_id, item_id)
        self._make_room(d, len(data), keep=path.name)
        _fsutil.atomic_write(path, data)
        return True

    def _made_dir(self, conversation_id: str) -> Path:
        """The conversation's output folder, made if missing; OSError when something else is there."""
        d = self._dir(conversation_id)
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            _fsutil.make_dirs(d)
        else:
            if not stat.S_ISDIR(st.st_mode):
                raise OSError(f"{d} is not a directory")
        return d

    def _make_room(self, d: Path, incoming: int, *, keep: str) -> None:
        files = []
        for entry in os.scandir(d):
            if entry.is_file(follow_symlinks=False) and entry.name.endswith(".txt") and entry.name != keep:
                st = entry.stat(follow_symlinks=False)
                files.append((st.st_mtime_ns, st.st_size, entry.path))
        used = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if used + incoming <= self.quota_bytes:
                break
            os.unlink(path)
            used -= size
            log.info("tool_output.dropped_for_quota", path=path, bytes=size)

    def copy(self, source_id: str, target_id: str, items: "list[tuple[str, str]]") -> int:
        """Give ``target_id`` the kept outputs of ``items`` ((agent id, item id), oldest first) that
        ``source_id`` keeps (a fork's copied tool items): hard links where the file system allows,
        else copies, within the target's quota (its oldest go first, as for :meth:`keep`). Returns
        how many it got. Raises OSError, ValueError (a bad conversation id)."""
        src = self._dir(source_id)
        found = []
        for agent_id, item_id in items:
            name = _file(agent_id, item_id)
            try:
                st = os.lstat(src / name)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size <= self.quota_bytes:
                found.append((name, st.st_size))
        if not found:
            return 0
        dst = self._made_dir(target_id)
        copied = 0
        for name, size in found:
            self._make_room(dst, size, keep=name)
            target = dst / name
            try:
                os.unlink(target)  # an older one of the same item: replaced
            except FileNotFoundError:
                pass
            try:
                # A kept output is never written in place (keep replaces it whole): a link shares nothing that changes.
                os.link(src / name, target, follow_symlinks=False)
            except OSError:
                _fsutil.atomic_write(target, _fsutil.read_file(src / name))
            copied += 1
        return copied

    def size(self, conversation_id: str, agent_id: str, item_id: str) -> int | None:
        """Bytes of the kept output, or None when none is kept."""
        try:
            st = os.lstat(self._dir(conversation_id) / _file(agent_id, item_id))
        except (FileNotFoundError, ValueError):
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def read(self, conversation_id: str, agent_id: str, item_id: str, offset: int = 0,
             limit: int = PAGE_BYTES) -> tuple[str, int] | None:
        """(text from byte ``offset``, the next offset or 0 at the end); None when none is kept.

        A page ends on a character boundary, so pages join into the whole text; an
        ``offset`` inside a character starts the page at the next one.
        """
        path = self._dir(conversation_id) / _file(agent_id, item_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (FileNotFoundError, OSError):
            return None
        offset = max(0, offset)
        with os.fdopen(fd, "rb") as f:
            f.seek(offset)
            data = f.read(limit + 7)
        start = 0
        while start < 3 and start < len(data) and (data[start] & 0xC0) == 0x80:  # a character's tail
            start += 1
        data, offset = data[start:], offset + start
        if len(data) <= limit:
            return data.decode("utf-8", "replace"), 0
        end = limit
        while end > 0 and (data[end] & 0xC0) == 0x80:  # not inside a character
            end -= 1
        return data[:end].decode("utf-8", "replace"), offset + end

    def read_all(self, conversation_id: str, agent_id: str, item_id: str) -> str | None:
        """The whole kept output, or None."""
        first = self.read(conversation_id, agent_id, item_id, limit=self.quota_bytes)
        return None if first is None else first[0]


def find_item(lines: list[bytes], agent_id: str, item_id: str) -> "Item | None":
    """The last ``item`` record of (``agent_id``, ``item_id``) among journal ``lines``, decoded."""
    from . import wire

    needle = item_id.encode("utf-8", "replace")
    for line in reversed(lines):
        if needle not in line:  # cheap: most lines are not this item
            continue
        rec = wire.decode_record(line)
        if rec.type != "item":
            continue
        item = wire.decode_payload(rec)
        if item.id == item_id and item.agent_id == agent_id:
            return item
    return None


async def show_item(service: Any, ref: str, item_id: str, *, agent_id: str = "", offset: int = 0) -> "ItemInfo":
    """``show_item``: one item of conversation ``ref`` as last journaled, with a page of its kept output.

    ``service`` is the ConversationService (its journal and its ToolOutputs). Reads the journal
    a chunk at a time, takes no lease and opens no runtime. Raises NotFound when the
    conversation has no such item, Invalid for an offset past the end of the kept output.
    """
    from . import contract as c
    from . import wire
    from .store import scan

    reader = await service.reader(ref)  # reading takes no lease and opens no runtime
    cid = reader.record.id
    found = None
    async for lines in scan(reader.journal, reader.published_seq):  # a chunk at a time: the last form wins
        found = find_item(lines, agent_id, item_id) or found
    if found is None:
        raise c.NotFound(f"conversation {cid} has no item {item_id!r}" + (f" of agent {agent_id!r}" if agent_id else ""))
    outputs: ToolOutputs = service.tool_outputs
    size = await trio.to_thread.run_sync(outputs.size, cid, agent_id, item_id)
    if size is not None and offset > size:
        raise c.Invalid(f"offset {offset} is past the end of the kept output ({size} bytes)")
    page = await trio.to_thread.run_sync(outputs.read, cid, agent_id, item_id, offset)
    if page is None:
        return wire.ItemInfo(conversation=cid, item=found)
    text, next_offset = page
    return wire.ItemInfo(conversation=cid, item=found, kept=True, full_output=text, full_bytes=size or 0,
                         next_offset=next_offset)
