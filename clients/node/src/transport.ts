// The per-command deadline: a command's budget runs from its write
// (docs/failure-model.md). What an error means is classify.ts.

import { RedisTimeoutError, Shed } from "./errors.js";

/**
 * `reply` within `budgetMs`, measured from now: the caller sends the
 * command and arms this at once.
 *
 * When the timer runs, I/O that is already here is let in first (the
 * decision waits for the event loop's next check phase, after its poll
 * phase has read the sockets): a reply that arrived while the loop was
 * busy is Redis's answer, not a timeout. If there is still no reply:
 *
 * - the command was `written` to a connected socket: Redis did not answer
 *   in time, a Redis failure (RedisTimeoutError);
 * - it may not have been (a Cluster, a client still connecting): if the
 *   timer ran more than half a budget late, the event loop is behind and
 *   the wait can't be blamed on Redis: Shed. Otherwise Redis had the
 *   budget with a loop that kept up: a Redis failure.
 */
export function bounded<T>(reply: Promise<T>, budgetMs: number, written: boolean): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    const due = performance.now() + budgetMs;
    const timer = setTimeout(() => {
      const late = performance.now() - due;
      setImmediate(() => {
        if (settled) return;
        settled = true;
        if (!written && late > budgetMs / 2) {
          reject(new Shed(`the event loop fell ${Math.round(late)} ms behind the call`));
        } else {
          reject(new RedisTimeoutError(`no reply from Redis within ${budgetMs} ms of the command`));
        }
      });
    }, budgetMs);
    reply.then(
      (value) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}
