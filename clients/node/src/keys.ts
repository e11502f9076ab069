// Keys: checked and normalised once per call, so the duplicate check, the
// denial cache, the local buckets and Cluster slots all see one identity
// per Redis key (a string and the Buffer of its UTF-8 bytes are one key).

import type { Key } from "./bucket.js";

/**
 * A key's identity: its bytes, one char per byte (latin1). An ASCII string
 * is already that, which is the usual case and costs nothing.
 */
export function keyId(key: Key, group?: number): string {
  if (typeof key === "string") {
    // biome-ignore lint/suspicious/noControlCharactersInRegex: the ASCII range, NUL included
    return /^[\x00-\x7f]*$/.test(key) ? key : Buffer.from(key, "utf8").toString("latin1");
  }
  if (Buffer.isBuffer(key)) return key.toString("latin1");
  const where = group === undefined ? "" : ` (group ${group})`;
  throw new TypeError(`a key must be a string or a Buffer${where}, got ${key === null ? "null" : typeof key}`);
}

/** The bytes of a key identity (keyId), for hashing. */
function bytesOf(id: string): Buffer {
  return Buffer.from(id, "latin1");
}

// CRC16/XMODEM (polynomial 0x1021, initial 0): the hash Redis Cluster uses
// for key slots. Table built once.
const CRC_TABLE = (() => {
  const table = new Uint16Array(256);
  for (let i = 0; i < 256; i++) {
    let crc = i << 8;
    for (let j = 0; j < 8; j++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    table[i] = crc;
  }
  return table;
})();

function crc16(data: Uint8Array): number {
  let crc = 0;
  for (const byte of data) crc = ((crc << 8) & 0xffff) ^ (CRC_TABLE[((crc >> 8) ^ byte) & 0xff] as number);
  return crc;
}

/**
 * The Cluster hash slot of a key identity: only the part between the first
 * `{` and the next `}` is hashed, when that part is not empty.
 */
export function slotOf(id: string): number {
  let hashed = id;
  const open = id.indexOf("{");
  if (open >= 0) {
    const close = id.indexOf("}", open + 1);
    if (close > open + 1) hashed = id.slice(open + 1, close);
  }
  return crc16(bytesOf(hashed)) % 16384;
}

/**
 * Keys `prefix:{tag}:name`, one per name, all in one Cluster slot (only the
 * `{tag}` part is hashed), so `consumeMany` on them is one atomic
 * TB.MCONSUME: `hashTagged("user42", ["user", "llm"])` is
 * `["rl:{user42}:user", "rl:{user42}:llm"]`.
 */
export function hashTagged(tag: string, names: readonly string[], prefix = "rl"): string[] {
  if (!tag || tag.includes("}")) throw new RangeError("tag must be non-empty and must not contain '}'");
  // Redis hashes the first {...} of the key: it must be the tag.
  if (prefix.includes("{")) throw new RangeError("prefix must not contain '{'");
  if (names.length === 0) throw new RangeError("hashTagged needs at least one name");
  return names.map((name) => `${prefix}:{${tag}}:${name}`);
}
