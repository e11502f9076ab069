// The small adapters that let the limiter speak through ioredis (Redis and
// Cluster) or node-redis v4+ (createClient and createCluster) without
// depending on either: each is recognised by its shape, and only the few
// methods below are used.

import type { Key } from "./bucket.js";
import { keyId, slotOf } from "./keys.js";

export type Arg = string | Buffer;

/** Any client the limiter accepts: an ioredis Redis or Cluster, a node-redis client or cluster. */
// biome-ignore lint/suspicious/noExplicitAny: clients of two libraries, recognised by shape
export type RedisLike = any;

export type ClientKind = "ioredis" | "ioredis-cluster" | "node-redis" | "node-redis-cluster";

export interface Connection {
  readonly kind: ClientKind;
  readonly cluster: boolean;
  /** Sends one command; on a Cluster, `key` (the command's first key) routes it. */
  send(args: readonly Arg[], key: Key | undefined, readonly: boolean): Promise<unknown>;
  /**
   * Whether a command sent now is written to the socket at once: a plain
   * client that is connected. (A Cluster may first fetch its slot map or
   * follow a redirection: the limiter can't see when it writes.)
   */
  writesNow(): boolean;
  /**
   * Sends two commands back to back on one connection, the second written
   * before the first's reply comes back: one round trip (a plain client
   * only: a Cluster may route them apart).
   */
  sendPair(first: readonly Arg[], second: readonly Arg[]): [Promise<unknown>, Promise<unknown>];
  /** Sends `args` to every primary (one server: to it); replies in order. */
  everyPrimary(args: readonly Arg[]): Promise<unknown[]>;
  /** The Cluster slot of a key identity (keys.ts keyId). */
  slot(id: string): number;
}

/** Recognises the client and wraps it; a TypeError names what it expected. */
export function connect(client: RedisLike): Connection {
  if (client === null || typeof client !== "object") {
    throw new TypeError("Limiter needs an ioredis Redis or Cluster, or a node-redis client or cluster");
  }
  if (client.isCluster === true && typeof client.call === "function") return new IoredisCluster(client);
  if (typeof client.call === "function" && typeof client.status === "string") return new Ioredis(client);
  if (typeof client.nodeClient === "function" && typeof client.sendCommand === "function") {
    return new NodeRedisCluster(client);
  }
  if (typeof client.getSentinelNode === "function") {
    // Its sendCommand takes (isReadonly, args) and resends a command on
    // the next primary by itself: not the node-redis client the limiter speaks to.
    throw new TypeError(
      "Limiter does not support node-redis's Sentinel client (createSentinel): use ioredis with its sentinels option",
    );
  }
  if (typeof client.sendCommand === "function" && "isReady" in client) return new NodeRedis(client);
  throw new TypeError("Limiter needs an ioredis Redis or Cluster, or a node-redis client or cluster");
}

class Ioredis implements Connection {
  readonly kind = "ioredis";
  readonly cluster = false;
  constructor(private readonly client: RedisLike) {}

  send(args: readonly Arg[]): Promise<unknown> {
    return this.client.call(...args);
  }

  sendPair(first: readonly Arg[], second: readonly Arg[]): [Promise<unknown>, Promise<unknown>] {
    // ioredis writes each command to its one connection as it is called
    // (or queues both, in order, while it connects): neither waits for a reply.
    return [this.send(first), this.send(second)];
  }

  writesNow(): boolean {
    return this.client.status === "ready";
  }

  async everyPrimary(args: readonly Arg[]): Promise<unknown[]> {
    return [await this.send(args)];
  }

  slot(id: string): number {
    return slotOf(id);
  }
}

class IoredisCluster implements Connection {
  readonly kind = "ioredis-cluster";
  readonly cluster = true;
  constructor(private readonly client: RedisLike) {}

  send(args: readonly Arg[], key: Key | undefined): Promise<unknown> {
    // ioredis routes EVALSHA and FCALL by their numkeys, but it knows
    // nothing of TB.*: left to itself it would send those to a random node
    // and follow the MOVED, a second round trip per call. So the command
    // goes straight to the node its slot map names; a redirection (a slot
    // that moved) goes back through the cluster client, which follows it
    // and refreshes the map.
    const node = key === undefined ? undefined : this.nodeOf(key);
    if (node === undefined) return this.client.call(...args);
    return node.call(...args).catch((error: unknown) => {
      if (error instanceof Error && /^(MOVED|ASK) /.test(error.message)) return this.client.call(...args);
      throw error;
    });
  }

  private nodeOf(key: Key): RedisLike | undefined {
    const nodes = this.client.slots?.[slotOf(keyId(key))];
    const name = Array.isArray(nodes) ? nodes[0] : undefined;
    if (typeof name !== "string") return undefined;
    const node = this.client.connectionPool?.getInstanceByKey?.(name);
    return node && node.status === "ready" ? node : undefined;
  }

  writesNow(): boolean {
    return false;
  }

  sendPair(): never {
    throw new TypeError("a Cluster can't pipeline a WAIT behind a command");
  }

  async everyPrimary(args: readonly Arg[]): Promise<unknown[]> {
    let nodes: RedisLike[] = this.client.nodes("master");
    if (nodes.length === 0) {
      await this.client.call("PING"); // waits for the slot map
      nodes = this.client.nodes("master");
    }
    return Promise.all(nodes.map((node) => node.call(...args)));
  }

  slot(id: string): number {
    return slotOf(id);
  }
}

function strings(args: readonly Arg[]): Arg[] {
  return args as Arg[];
}

class NodeRedis implements Connection {
  readonly kind = "node-redis";
  readonly cluster = false;
  constructor(private readonly client: RedisLike) {}

  send(args: readonly Arg[]): Promise<unknown> {
    return this.client.sendCommand(strings(args));
  }

  sendPair(first: readonly Arg[], second: readonly Arg[]): [Promise<unknown>, Promise<unknown>] {
    // node-redis queues both on its one socket and writes the queue at
    // once (its automatic pipelining of the commands of one tick).
    return [this.send(first), this.send(second)];
  }

  writesNow(): boolean {
    return this.client.isReady === true;
  }

  async everyPrimary(args: readonly Arg[]): Promise<unknown[]> {
    return [await this.send(args)];
  }

  slot(id: string): number {
    return slotOf(id);
  }
}

class NodeRedisCluster implements Connection {
  readonly kind = "node-redis-cluster";
  readonly cluster = true;
  constructor(private readonly client: RedisLike) {}

  send(args: readonly Arg[], key: Key | undefined, readonly: boolean): Promise<unknown> {
    // node-redis routes by the first key it is given and follows MOVED/ASK.
    return this.client.sendCommand(key, readonly, strings(args));
  }

  writesNow(): boolean {
    return false;
  }

  sendPair(): never {
    throw new TypeError("a Cluster can't pipeline a WAIT behind a command");
  }

  async everyPrimary(args: readonly Arg[]): Promise<unknown[]> {
    // v4: getMasters(); v5 and later: the masters property.
    const masters: RedisLike[] =
      typeof this.client.getMasters === "function" ? this.client.getMasters() : this.client.masters;
    return Promise.all(
      masters.map(async (master) => {
        const node = await this.client.nodeClient(master);
        return node.sendCommand(strings(args));
      }),
    );
  }

  slot(id: string): number {
    return slotOf(id);
  }
}
