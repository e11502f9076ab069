// A stub LLM backend: deterministic, no network, so the reserve -> call ->
// settle path runs end to end in tests.

export class LLMError extends Error {}

/** Whitespace words as tokens: stands in for the model's tokenizer. */
export const countTokens = (text) => text.split(/\s+/).filter(Boolean).length;

/** Echoes the prompt backwards, one token per word, at most maxTokens. */
export class StubLLM {
  async complete(prompt, maxTokens) {
    const words = prompt.split(/\s+/).filter(Boolean).reverse().slice(0, maxTokens);
    return { text: words.join(" "), promptTokens: countTokens(prompt), completionTokens: words.length };
  }
}
