"""The turn benchmarks' order (tests/bench/_turns.py ROUNDS) is balanced, as its comment says.

What a side leaves running after its turn slows whichever side runs next, so the
order decides who pays for whom: each side must follow each other side equally
often, never itself, and wait the same gaps between its own turns.
"""

from __future__ import annotations

import collections

from bench._turns import ROUNDS, TURNS

SIDES = range(4)


def _cycle() -> list[int]:
    return [side for round_ in ROUNDS for side in round_]


def test_each_round_gives_every_side_one_turn() -> None:
    assert all(sorted(round_) == list(SIDES) for round_ in ROUNDS)
    assert TURNS % len(ROUNDS) == 0  # a full run is whole cycles


def test_each_side_follows_each_other_side_equally_often_and_never_itself() -> None:
    seq = _cycle()
    follows = collections.Counter(zip(seq, seq[1:] + seq[:1]))  # the last round is followed by the first
    assert not any(follows[(s, s)] for s in SIDES)
    counts = {follows[(a, b)] for a in SIDES for b in SIDES if a != b}
    assert counts == {len(seq) // (len(SIDES) * (len(SIDES) - 1))}


def test_every_side_waits_the_same_gaps_between_its_own_turns_never_fewer_than_two() -> None:
    seq = _cycle()
    gaps = {}
    for side in SIDES:
        at = [t for t, s in enumerate(seq) if s == side]
        gaps[side] = sorted((at[(i + 1) % len(at)] - t) % len(seq) - 1 for i, t in enumerate(at))
    assert len({tuple(g) for g in gaps.values()}) == 1
    assert min(gaps[0]) >= 2
