"""What masking echoed secrets (agentd.masking) costs per record and per text delta.

The rule holds 20 literal secrets (a rich environment: GitHub tokens, a
handful of API keys, the gateway token) plus the header rule. A journal
record of about 200 bytes with no secret in it is masked (``mask_json``, the
call before every append), next to the journal's own ``append`` of that
record (fsync ``never``, so the write is a page-cache copy); a 20-character
text delta is fed to a :class:`~agentd.masking.DeltaMasker`, next to
encoding the delta (what the pump does with it anyway).
"""

from __future__ import annotations

import time

import msgspec

from agentd import masking
from agentd.contract import Delta, ItemKind
from agentd.journal import FsyncPolicy, JournalStore

from ._common import Ctx, Result
from .bench_journal import PAYLOAD, RUN

SECRETS = [f"sk-bench-{i:02d}-{'abcdef0123456789' * 2}" for i in range(20)]


def _per_call_us(fn, n: int, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return out


def bench_masking(ctx: Ctx) -> list[Result]:
    n, repeats = (2_000, 3) if ctx.quick else (100_000, 7)
    masking.register(*SECRETS)
    store = JournalStore(ctx.scratch("masking"), fsync=FsyncPolicy.NEVER)
    journal = store.open("cbench0000001")
    record = Result("secrets masking, per journal record (~200 B, none found)", "µs", higher=False,
                    baseline_name="journal append (fsync never)")
    record.samples = _per_call_us(lambda: masking.mask_json(PAYLOAD), n, repeats)
    record.baseline = _per_call_us(lambda: journal.append("item", PAYLOAD, run=RUN), n, repeats)
    journal.close()
    deltas = masking.DeltaMasker()
    delta = Delta(item_id="i0123abcd", kind=ItemKind.ASSISTANT, text="a streamed chunk of t ")
    encode = msgspec.json.Encoder().encode
    text = Result("secrets masking, per text delta (22 chars)", "µs", higher=False, baseline_name="encoding the delta")
    text.samples = _per_call_us(lambda: deltas.feed(delta.item_id, delta.text, delta), n, repeats)
    text.baseline = _per_call_us(lambda: encode(delta), n, repeats)
    for r in (record, text):
        r.notes.append(f"{len(SECRETS)} literal secrets and the header rule; fastest repeat "
                       f"{min(r.samples):.2f} µs (baseline {min(r.baseline):.2f} µs), {n} calls a repeat")
    return [record, text]
