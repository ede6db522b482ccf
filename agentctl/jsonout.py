"""``--json`` output of results: Structs with every field named, defaults included.

Kept apart from :mod:`agentctl.render` so that a command printing one result
as JSON does not load the terminal renderer.
"""

from __future__ import annotations

from typing import Any

import msgspec


def full(obj: Any) -> Any:
    """``obj`` with every Struct turned into a dict of all its fields, defaults included.

    The wire and journal omit defaults to stay lean; ``--json`` output names
    every field so a script can rely on a key being there.
    """
    if isinstance(obj, msgspec.Struct):
        out: dict[str, Any] = {}
        cfg = obj.__struct_config__
        if cfg.tag_field is not None:
            out[cfg.tag_field] = cfg.tag
        for f in msgspec.structs.fields(obj):
            out[f.encode_name] = full(getattr(obj, f.name))
        return out
    if isinstance(obj, (list, tuple)):
        return [full(x) for x in obj]
    if isinstance(obj, dict):
        return {k: full(v) for k, v in obj.items()}
    return obj
