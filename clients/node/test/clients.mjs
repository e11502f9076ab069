// Clients of every library the package supports, for a server or a cluster:
// ioredis 5 and 6, node-redis 4 and 6 (aliases in this project's package.json).

import IORedis5 from "ioredis";
import IORedis6 from "ioredis6";
import * as nodeRedis4 from "redis";
import * as nodeRedis6 from "redis6";

export const LIBRARIES = ["ioredis", "ioredis6", "redis", "redis6"];

const IOREDIS = { ioredis: IORedis5, ioredis6: IORedis6 };
const NODE_REDIS = { redis: nodeRedis4, redis6: nodeRedis6 };

/** A connected client of `lib` to 127.0.0.1:`port`; `close()` ends it. */
export async function client(lib, port, auth = {}, options = {}) {
  if (lib in IOREDIS) {
    const c = new IOREDIS[lib]({ port, host: "127.0.0.1", ...auth, ...options });
    c.on("error", () => {});
    if (!options.lazyConnect) await c.ping().catch(() => {});
    return { client: c, close: () => c.disconnect() };
  }
  const c = NODE_REDIS[lib].createClient({ socket: { port, host: "127.0.0.1", ...options.socket }, ...auth });
  c.on("error", () => {});
  await c.connect();
  return { client: c, close: () => c.disconnect().catch(() => {}) };
}

/** A connected cluster client of `lib`, seeded with the first node. */
export async function clusterClient(lib, port) {
  if (lib in IOREDIS) {
    const c = new IOREDIS[lib].Cluster([{ host: "127.0.0.1", port }]);
    c.on("error", () => {});
    await c.ping();
    return { client: c, close: () => c.disconnect() };
  }
  const c = NODE_REDIS[lib].createCluster({ rootNodes: [{ socket: { host: "127.0.0.1", port } }] });
  c.on("error", () => {});
  await c.connect();
  return { client: c, close: () => c.disconnect().catch(() => {}) };
}
