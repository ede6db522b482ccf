"""agentd.accounts.login with a token: bounded before any work, and masked only while a runtime
may hold it (a refused or unusable token is no secret, and masking it on would hide that word
in every later record)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from agentd import accounts, masking
from agentd import contract as c


class Provider:
    def __init__(self, *, sign_in: bool, refuse: bool = False) -> None:
        self._caps = c.Capabilities(sign_in=sign_in)
        self.refuse = refuse
        self.seen: list[str] = []

    def capabilities(self) -> c.Capabilities:
        return self._caps

    async def sign_in(self, token: str) -> c.Account:
        self.seen.append(masking.mask_text(f"runtime echo: {token}"))
        if self.refuse:
            raise c.Invalid("the runtime refused the token")
        return c.Account(signed_in=True, source="stored")


class Runtimes:
    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.asked = 0

    async def get(self, name: str) -> Any:
        self.asked += 1
        return self.provider


def login(runtimes: Runtimes, token: str) -> Any:
    return trio.run(lambda: accounts.login(runtimes, "p", token=token))


def test_a_token_over_the_bound_is_refused_before_anything_is_done_with_it() -> None:
    runtimes = Runtimes(Provider(sign_in=True))
    with pytest.raises(c.Invalid, match="at most 2,048"):
        login(runtimes, "t" * (accounts.MAX_TOKEN_CHARS + 1))
    assert runtimes.asked == 0 and runtimes.provider.seen == []


def test_a_token_a_provider_cannot_take_is_never_masked() -> None:
    with pytest.raises(c.Unsupported):
        login(Runtimes(Provider(sign_in=False)), "unsupportedword")
    assert masking.mask_text("refactor this unsupportedword please") == "refactor this unsupportedword please"


def test_a_refused_token_is_masked_while_the_runtime_has_it_then_no_more() -> None:
    provider = Provider(sign_in=True, refuse=True)
    with pytest.raises(c.Invalid, match="refused"):
        login(Runtimes(provider), "refusedword1")
    assert provider.seen == ["runtime echo: [redacted]"]  # masked while the runtime could echo it
    assert masking.mask_text("refactor this refusedword1") == "refactor this refusedword1"


def test_an_accepted_token_stays_masked() -> None:
    provider = Provider(sign_in=True)
    result = login(Runtimes(provider), "acceptedtoken-0123")
    assert result.done and provider.seen == ["runtime echo: [redacted]"]
    assert masking.mask_text("x acceptedtoken-0123 y") == "x [redacted] y"
