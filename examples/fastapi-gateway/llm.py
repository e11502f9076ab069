"""A stub LLM backend: deterministic, no network, so the gateway's
reserve -> call -> settle path can run end to end in tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from pydantic import BaseModel


class Completion(BaseModel):
    text: str
    prompt_tokens: int
    completion_tokens: int


class LLMError(Exception):
    """The model backend failed; nothing was generated."""


class LLMBackend(Protocol):
    async def complete(self, prompt: str, max_tokens: int) -> Completion: ...

    def stream(self, prompt: str, max_tokens: int) -> AsyncIterator[str]:
        """The completion's tokens, one by one, as the model makes them."""
        ...


def count_tokens(text: str) -> int:
    """Whitespace words as tokens: stands in for the model's tokenizer
    (tiktoken and the like), which the gateway must use to reserve."""
    return len(text.split())


class StubLLM:
    """Echoes the prompt backwards, one token per word, at most max_tokens.
    Real models usually stop before max_tokens, so reservations are refunded
    in part; that is what the settle step is for. `token_delay_ms` is a
    pause before each token, as a real model takes (0: none)."""

    token_delay = 0.0

    def __init__(self, token_delay_ms: int = 0) -> None:
        self.token_delay = token_delay_ms / 1000

    async def complete(self, prompt: str, max_tokens: int) -> Completion:
        words = [word async for word in self.stream(prompt, max_tokens)]
        return Completion(
            text=" ".join(words), prompt_tokens=count_tokens(prompt), completion_tokens=len(words)
        )

    async def stream(self, prompt: str, max_tokens: int) -> AsyncIterator[str]:
        for word in prompt.split()[::-1][:max_tokens]:
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
            yield word
