#!/usr/bin/env python3
"""RESP command streams for `redis-cli --pipe`, to create many buckets fast.

    gen.py KIND COUNT KEYFMT [FIRST | rand:RANGE] [-- WORD...]

KIND is one of:
  tb     TB.CONSUME key 100 0.01 1          (module)
  fcall  FCALL tb_consume 1 key 100 0.01 1  (Lua library)
  plain  HSET key tokens 99 ts <now_us> + PEXPIREAT key <now_ms + 100000>
         (the same hash and expiry TB.CONSUME writes, without the module)
  tbbig  TB.CONSUME key 1000000 0.001 1     (the throughput cases' bucket)
  fcallbig  FCALL tb_consume 1 key 1000000 0.001 1 (the same, in Lua)
  tbhot  TB.CONSUME key 1 0.0001 1          (the denied case's bucket)
  hset   HSET key tokens 1.5 ts 1764513600123456 (the throughput ceiling)
  cellbig  CL.THROTTLE key 999999 1 1000 1  (redis-cell: tbbig's bucket)
  cellhot  CL.THROTTLE key 0 1 10000 1      (redis-cell: tbhot's bucket)
  cmd    the WORDs after `--`, the word KEY replaced by the key (FCALL of
         another library, EVALSHA of a script)
  mcbig  TB.MCONSUME of 10,000 groups (key 1000000 0.001 1 each): the i-th
         command takes the keys KEYFMT % j for j in 10,000 i .. 10,000 i + 9,999

Keys are KEYFMT % i for i in FIRST .. FIRST+COUNT-1 (FIRST defaults to 0),
or, with rand:RANGE, for COUNT numbers drawn from [0, RANGE) by a fixed
seed: the same stream every time, so two callgrind runs differ only in
length (redis-benchmark 7.0 cannot be seeded).
"""

import random
import sys
import time


# Groups of one `mcbig` command: the most TB.MCONSUME takes.
MC_GROUPS = 10_000


def bulk(s: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(s), s)


def command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(bulk(a) for a in args)


def main() -> None:
    kind, count, keyfmt = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
    rest = sys.argv[4:]
    words = []
    if "--" in rest:
        words = [w.encode() for w in rest[rest.index("--") + 1 :]]
        rest = rest[: rest.index("--")]
    spec = rest[0] if rest else "0"
    if spec.startswith("rand:"):
        rng, bound = random.Random(20251130), int(spec[5:])
        numbers = (rng.randrange(bound) for _ in range(count))
    else:
        numbers = iter(range(int(spec), int(spec) + count))
    now_us = time.time_ns() // 1000
    if kind == "mcbig":
        out = sys.stdout.buffer
        for i in numbers:
            args = [b"TB.MCONSUME"]
            for j in range(i * MC_GROUPS, (i + 1) * MC_GROUPS):
                args += [keyfmt % j, b"1000000", b"0.001", b"1"]
            out.write(command(*args))
        out.flush()
        return
    # Each template has one %s hole for the key's bulk string ($len + key).
    if kind == "tb":
        parts = [command(b"TB.CONSUME", b"\0", b"100", b"0.01", b"1")]
    elif kind == "tbbig":
        parts = [command(b"TB.CONSUME", b"\0", b"1000000", b"0.001", b"1")]
    elif kind == "tbhot":
        parts = [command(b"TB.CONSUME", b"\0", b"1", b"0.0001", b"1")]
    elif kind == "hset":
        parts = [command(b"HSET", b"\0", b"tokens", b"1.5", b"ts", b"1764513600123456")]
    elif kind == "fcall":
        parts = [command(b"FCALL", b"tb_consume", b"1", b"\0", b"100", b"0.01", b"1")]
    elif kind == "fcallbig":
        parts = [command(b"FCALL", b"tb_consume", b"1", b"\0", b"1000000", b"0.001", b"1")]
    elif kind == "cellbig":
        parts = [command(b"CL.THROTTLE", b"\0", b"999999", b"1", b"1000", b"1")]
    elif kind == "cellhot":
        parts = [command(b"CL.THROTTLE", b"\0", b"0", b"1", b"10000", b"1")]
    elif kind == "cmd" and words:
        parts = [command(*(b"\0" if w == b"KEY" else w for w in words))]
    elif kind == "plain":
        ts = str(now_us).encode()
        at = str(now_us // 1000 + 100_000).encode()
        parts = [
            command(b"HSET", b"\0", b"tokens", b"99", b"ts", ts),
            command(b"PEXPIREAT", b"\0", at),
        ]
    else:
        sys.exit(f"gen.py: unknown kind {kind!r}")
    # Replace the placeholder bulk "$1\r\n\0\r\n" by a %s hole.
    template = b"".join(parts).replace(b"%", b"%%").replace(b"$1\r\n\0\r\n", b"%s")
    holes = template.count(b"%s")
    out = sys.stdout.buffer
    chunk = []
    for i in numbers:
        key = keyfmt % i if b"%" in keyfmt else keyfmt
        k = b"$%d\r\n%s\r\n" % (len(key), key)
        chunk.append(template % ((k,) * holes))
        if len(chunk) == 10_000:
            out.write(b"".join(chunk))
            chunk.clear()
    out.write(b"".join(chunk))
    out.flush()


if __name__ == "__main__":
    main()
