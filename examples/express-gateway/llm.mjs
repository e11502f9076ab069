// A stub LLM backend: deterministic, no network, so the reserve -> call ->
// settle path runs end to end in tests, whole or token by token.

import { setTimeout as sleep } from "node:timers/promises";

export class LLMError extends Error {}

/** Whitespace words as tokens: stands in for the model's tokenizer. */
export const countTokens = (text) => text.split(/\s+/).filter(Boolean).length;

/**
 * Echoes the prompt backwards, one token per word, at most maxTokens.
 * `tokenDelayMs` is a pause before each token, as a real model takes (0: none).
 */
export class StubLLM {
  constructor(tokenDelayMs = 0) {
    this.tokenDelayMs = tokenDelayMs;
  }

  async complete(prompt, maxTokens) {
    const words = [];
    for await (const word of this.stream(prompt, maxTokens)) words.push(word);
    return { text: words.join(" "), promptTokens: countTokens(prompt), completionTokens: words.length };
  }

  /** The completion's tokens, one by one, as the model makes them. */
  async *stream(prompt, maxTokens) {
    for (const word of prompt.split(/\s+/).filter(Boolean).reverse().slice(0, maxTokens)) {
      if (this.tokenDelayMs) await sleep(this.tokenDelayMs);
      yield word;
    }
  }
}
