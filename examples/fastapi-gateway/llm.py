"""A stub LLM backend: deterministic, no network, so the gateway's
reserve -> call -> settle path can run end to end in tests."""

from __future__ import annotations

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


def count_tokens(text: str) -> int:
    """Whitespace words as tokens: stands in for the model's tokenizer
    (tiktoken and the like), which the gateway must use to reserve."""
    return len(text.split())


class StubLLM:
    """Echoes the prompt backwards, one token per word, at most max_tokens.
    Real models usually stop before max_tokens, so reservations are refunded
    in part; that is what the settle step is for."""

    async def complete(self, prompt: str, max_tokens: int) -> Completion:
        words = prompt.split()[::-1][:max_tokens]
        return Completion(
            text=" ".join(words), prompt_tokens=count_tokens(prompt), completion_tokens=len(words)
        )
