// What the HTTP tests share: an app (Express, or anything with listen) on
// a free loopback port, and a GET that reads the whole answer.

/** `app` listening on 127.0.0.1; `url` is its base, `close()` stops it. */
export async function serve(app) {
  const server = app.listen(0, "127.0.0.1");
  await new Promise((r) => server.once("listening", r));
  return { url: `http://127.0.0.1:${server.address().port}`, close: () => server.close() };
}

/** A request's status, headers (lower-case names) and body text. */
export async function get(url, headers = {}, method = "GET") {
  const r = await fetch(url, { headers, method });
  return { status: r.status, headers: Object.fromEntries(r.headers), body: await r.text() };
}

/** An express-rate-limit logger that keeps what it is told: `codes()` lists the ERR_ERL_... codes. */
export function erlLogger() {
  const lines = [];
  const keep = (...args) => lines.push(args);
  return {
    lines,
    warn: keep,
    error: keep,
    codes: () => lines.flat().map((x) => x?.code ?? String(x)),
  };
}

export const QUIET = { error() {}, warn() {} };
