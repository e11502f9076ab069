#!/usr/bin/env python3
"""Writes the checked-in seed corpora fuzz/corpus/{args,state,bucket}/.

The formats are the ones testkit/src/oracles/mod.rs decodes:
  args    argv joined with "\\n" (argv[0] picks the parser: the quota
          commands and TB.CHARGE have theirs);
  state   one flags byte ("3": both fields present), tokens "\\n" ts;
  bucket  flags u8 | max f64 | rate f64 | a u16 | b u16 | tokens f64 | t u16
          | ts i64 | now i64 | dt i32 | cost f64 | c u16 | delta f64 | d u16
          | steps: (kind u8, dt u32, frac u16)*   (little-endian)
  lease   flags u8 | n u8 | n leases: (id u8, expiry ms i16, weight u8) or,
          with flags bit 1 and an odd id byte, (id u8, len u8, bytes)
          | [flags bit 0: summary len u8, bytes]
          | calls: (kind u8, id u8, dt ms i16, lease_ms u16, weight u8)*

Run it after changing a format: python3 fuzz/seeds.py
"""

import math
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for name, data in seeds:
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


def argv(*parts):
    return b"\n".join(p if isinstance(p, bytes) else p.encode() for p in parts)


C, P, A, M = "TB.CONSUME", "TB.PEEK", "TB.ADJUST", "TB.MCONSUME"
ACQUIRE, Q, QP, QA, CH = "TB.ACQUIRE", "TB.QUOTA", "TB.QPEEK", "TB.QADJUST", "TB.CHARGE"

args = [
    ("consume-valid", argv(C, "k", "10", "1", "1")),
    ("consume-default-cost", argv(C, "k", "10", "0.17")),
    ("peek-valid", argv(P, "k", "5", "2.5", "0")),
    ("adjust-refund", argv(A, "k", "10", "1", "-25.5")),
    ("adjust-charge", argv(A, "k", "10", "1", "3e2")),
    ("mconsume-two", argv(M, "a", "10", "1", "1", "b", "5", "2", "0")),
    ("mconsume-dup", argv(M, "a", "1", "1", "1", "b", "1", "1", "1", "a", "1", "1", "1")),
    ("mconsume-arity", argv(M, "a", "1", "1", "1", "b")),
    ("nan", argv(C, "k", "nan", "1")),
    ("NaN-rate", argv(C, "k", "10", "NaN")),
    ("inf", argv(C, "k", "inf", "1")),
    ("minus-infinity", argv(C, "k", "10", "1", "-infinity")),
    ("hex", argv(C, "k", "0x10", "1")),
    ("space-inside", argv(C, "k", "1 0", "1")),
    ("space-around", argv(C, "k", " 10", "1 ")),
    ("empty", argv(C, "k", "", "")),
    ("nul", argv(C, "k", b"10\x00", b"\x001")),
    ("nul-key", argv(M, b"\x00", "1", "1", "1", b"\x00\x00", "1", "1", "1")),
    ("huge-exponent", argv(C, "k", "1e99999999999999999999", "1")),
    ("tiny-exponent", argv(C, "k", "1e-99999999999", "1")),
    ("subnormal", argv(C, "k", "5e-324", "5e-324", "0")),
    ("max-bound", argv(C, "k", "1e12", "100", "1e12")),
    ("above-max-bound", argv(C, "k", "1000000000000.0001", "1e12")),
    ("fill-bound", argv(C, "k", "1e10", "1", "1")),
    ("fill-too-slow", argv(C, "k", "1e10", "0.99999", "1")),
    ("cost-above-max", argv(C, "k", "10", "1", "10.000000000001")),
    ("negative-zero-cost", argv(C, "k", "10", "1", "-0")),
    ("signs", argv(C, "k", "+1.", "+.5", "-.0e-0")),
    ("long-digits", argv(C, "k", "0." + "0" * 400 + "1", "1" + "0" * 11)),
    ("utf8-digit", argv(C, "k", "１", "1")),
    ("high-bytes", argv(C, "k", b"\xff\xfe", b"1")),
    ("arity-short", argv(C, "k")),
    ("arity-long", argv(C, "k", "1", "1", "1", "1")),
    ("adjust-nan-delta", argv(A, "k", "10", "1", "nan")),
    ("mconsume-many", argv(M, *[x for i in range(64) for x in (f"k{i}", "10", "1", "1")], "k7", "10", "1", "1")),
    ("acquire-bad", argv(ACQUIRE, "k", "0", "-1", "", "")),
    ("acquire-bucket", argv(ACQUIRE, "k", "8", "30000", "id", "2", "BUCKET", "b", "10", "1", "1")),
    ("acquire-id-named-bucket", argv("tb.acquire", "k", "8", "1", "BUCKET", "BUCKET", "b", "10", "1", "1",
                                     "bucket", "c", "5", "2", "0")),
    # WAIT max_ms: after the cost or in its place, its bounds, misspelt.
    ("consume-wait", argv(C, "k", "10", "1", "3", "WAIT", "5000")),
    ("peek-wait-default-cost", argv(P, "k", "10", "1", "wait", "0")),
    ("consume-wait-bound", argv(C, "k", "10", "1", "1", "WAIT", "100000000000000")),
    ("consume-wait-above-bound", argv(C, "k", "10", "1", "1", "WAIT", "100000000000001")),
    ("consume-wait-not-integer", argv(C, "k", "10", "1", "WAIT", "1.5")),
    ("consume-waits", argv(C, "k", "10", "1", "1", "WAITS", "5")),
    # Calendar quotas.
    ("quota-valid", argv(Q, "q", "1000000", "DAY", "1200")),
    ("quota-default-cost", argv(Q, "q", "10", "month")),
    ("quota-offset", argv(Q, "q", "10", "WEEK", "OFFSET", "-300")),
    ("qpeek-cost-offset", argv(QP, "q", "10", "3600", "2", "offset", "1439")),
    ("qadjust-offset", argv(QA, "q", "10", "YEAR", "-4.5", "OFFSET", "330")),
    ("qadjust-no-delta", argv(QA, "q", "10", "DAY")),
    ("quota-bad-period", argv(Q, "q", "10", "FORTNIGHT")),
    ("quota-period-bound", argv(Q, "q", "10", "10000000001")),
    ("quota-offset-out-of-range", argv(Q, "q", "10", "DAY", "1", "OFFSET", "1440")),
    ("quota-expected-offset", argv(Q, "q", "10", "DAY", "1", "2")),
    ("quota-cost-above-limit", argv(Q, "q", "0.5", "DAY")),
    ("quota-cost-too-small", argv(Q, "q", "1e12", "DAY", "0.00001")),
    # TB.CHARGE: counted keys, WAIT, both clauses, OFFSET, and its errors.
    ("charge-two", argv(CH, "2", "m", "q", "BUCKET", "60", "1", "1", "QUOTA", "1000000", "MONTH", "1200")),
    ("charge-wait-offset", argv(CH, "3", "q", "m", "d", "WAIT", "5000", "QUOTA", "1000", "DAY", "1", "OFFSET",
                                "-300", "BUCKET", "60", "1", "1", "quota", "10", "3600", "1")),
    ("charge-keyword-keys", argv(CH, "3", "WAIT", "QUOTA", "OFFSET", "WAIT", "9", "QUOTA", "5", "DAY", "1",
                                 "OFFSET", "60", "BUCKET", "5", "1", "1", "QUOTA", "5", "WEEK", "1")),
    ("charge-dup", argv(CH, "2", "a", "a", "BUCKET", "1", "1", "1", "QUOTA", "1", "DAY", "1")),
    ("charge-expected-clause", argv(CH, "1", "k", "BUCKETS", "1", "1", "1")),
    ("charge-numkeys-zero", argv(CH, "0", "k", "BUCKET", "1", "1", "1")),
    ("charge-numkeys-too-many", argv(CH, "10001", "k", "BUCKET", "1", "1", "1")),
    ("charge-numkeys-past-end", argv(CH, "5", "a", "b")),
    ("charge-offset-cut", argv(CH, "1", "k", "QUOTA", "5", "DAY", "1", "OFFSET")),
    ("charge-left-over", argv(CH, "1", "k", "BUCKET", "1", "1", "1", "1")),
    ("charge-wait-cut", argv(CH, "1", "k", "WAIT")),
]

state = [
    ("valid", b"3" + b"9.5\n1764513600123456"),
    ("zero", b"3" + b"0\n0"),
    ("negative", b"3" + b"-3.5e-9\n-5"),
    ("lua-format", b"3" + b"0.10000000000000001\n1764513600123456"),
    ("subnormal", b"3" + b"5e-324\n1"),
    ("huge", b"3" + b"1e308\n9999999999999999"),
    ("overflow", b"3" + b"1e309\n1"),
    ("ts-17-digits", b"3" + b"1\n12345678901234567"),
    ("ts-float", b"3" + b"1\n1.5"),
    ("ts-plus", b"3" + b"1\n+5"),
    ("nan", b"3" + b"nan\n1"),
    ("inf", b"3" + b"-inf\n1"),
    ("hex", b"3" + b"0x10\n0x10"),
    ("spaces", b"3" + b" 1\n1 "),
    ("nul", b"3" + b"1\x00\n\x001"),
    ("empty", b"3" + b"\n"),
    ("tokens-only", b"1" + b"1\n1"),
    ("ts-only", b"2" + b"1\n1"),
    ("neither", b"0"),
    ("f64-nan-bits", struct.pack("<d", math.nan)),
    ("f64-max-bits", struct.pack("<d", 1.7976931348623157e308)),
    ("i64-min-bits", struct.pack("<q", -(2**63))),
    # Found by the fuzzer: a point's place below 1 (it once wrapped).
    ("fraction-below-one", b"3" + b".5\n6"),
]


def bucket(flags, mx=0.0, rate=0.0, a=0, b=0, tokens=0.0, t=0, ts=0, now=0, dt=0,
           cost=0.0, c=0, delta=0.0, d=0, steps=()):
    out = struct.pack("<BddHH", flags, mx, rate, a, b)
    out += struct.pack("<dHqqidHdH", tokens, t, ts, now, dt, cost, c, delta, d)
    for kind, sdt, frac in steps:
        out += struct.pack("<BIH", kind, sdt, frac)
    return out


NOW = 1_764_513_600_123_456
RAW = 1 | 2 | 4 | 16 | 32  # every value raw, key present
schedule = [(0, 1000, 65535 // 10), (0x80, 200_000, 65535), (2, 5000, 40000),
            (1, 0, 65535), (0, 1_000_000, 65535 // 3), (2, 7, 0)] * 4

bucket_seeds = [
    ("mapped-zero", bucket(0)),
    ("mapped-mid", bucket(0, a=40000, b=30000, t=50000, ts=NOW, dt=1500, c=30000, d=20000, steps=schedule)),
    ("mapped-empty-key", bucket(8, a=65535, b=65535, ts=NOW, dt=-1000, c=65535, steps=schedule)),
    ("mapped-tiny", bucket(0, a=1, b=65535, t=1, ts=NOW, dt=999, c=65535, d=65535, steps=schedule)),
    ("raw-valid", bucket(RAW, 10.0, 1.0, tokens=3.0, ts=NOW, now=NOW + 1_500_000, cost=2.0, delta=-25.5, steps=schedule)),
    ("raw-contract", bucket(RAW, 10.0, 0.3, tokens=1.4, ts=NOW, now=NOW, cost=2.0, delta=1.0)),
    ("raw-bounds", bucket(RAW, 1e12, 100.0, tokens=-1e12, ts=0, now=1, cost=1e12, delta=1e12, steps=schedule)),
    ("raw-fast", bucket(RAW, 1e12, 1e12, tokens=-1e12, ts=NOW, now=NOW + 1, cost=0.5, delta=-1e13)),
    ("raw-subnormal", bucket(RAW, 5e-324, 5e-324, tokens=-5e-324, ts=NOW, now=NOW + 3, cost=5e-324, delta=5e-324)),
    ("raw-tiny-normal", bucket(RAW, 1e-300, 1e-310, tokens=0.0, ts=NOW, now=NOW, cost=1e-300, delta=-1e-300)),
    ("raw-nan", bucket(RAW, math.nan, math.nan, tokens=math.nan, ts=NOW, now=NOW, cost=math.nan, delta=math.nan)),
    ("raw-inf", bucket(RAW, math.inf, -math.inf, tokens=math.inf, ts=NOW, now=NOW, cost=math.inf, delta=-math.inf)),
    ("raw-nan-tokens", bucket(RAW, 10.0, 1.0, tokens=math.nan, ts=NOW, now=NOW + 10, cost=1.0, delta=math.inf)),
    ("raw-hostile-tokens", bucket(RAW, 10.0, 1.0, tokens=1e300, ts=-(2**63), now=2**63 - 1, cost=10.0, delta=-1e300)),
    ("raw-ts-future", bucket(RAW, 10.0, 1.0, tokens=-1e300, ts=2**63 - 1, now=-(2**63), cost=0.0, delta=0.0)),
    ("raw-zero-rate", bucket(RAW, 10.0, 0.0, tokens=1.0, ts=NOW, now=NOW, cost=5.0, delta=1.0)),
    ("raw-negative", bucket(RAW, -10.0, -1.0, tokens=-1.0, ts=NOW, now=NOW, cost=-5.0, delta=-1.0)),
    ("raw-fill-too-slow", bucket(RAW, 1e11, 1.0, tokens=0.0, ts=NOW, now=NOW, cost=1.0, delta=1.0)),
    # Found by the fuzzer, as the fuzzer wrote it (see the state seed).
    ("fraction-below-one", bytes.fromhex(
        "170000000000002440000000000000f03f000000009c75ffffffd12fbe55d1440600ffffffffff"
        "ffffffffffffffffff00000040000000000000f03f000000009c75ffffffffffff37ffffff3fff")),
]



def lease_case(flags, leases, summary=None, calls=()):
    out = bytes([flags, len(leases)])
    for k, lease in enumerate(leases):
        if isinstance(lease, bytes):  # (raw) an odd id byte, a length, the value
            out += bytes([2 * k + 1, len(lease)]) + lease
        else:
            idb, offset_ms, weight = lease
            out += struct.pack("<BhB", idb * 2, offset_ms, weight - 1)
    if summary is not None:
        out += bytes([len(summary)]) + summary
    for kind, idb, dt, lease_ms, weight in calls:
        out += struct.pack("<BBhHB", kind, idb, dt, lease_ms, weight - 1)
    return out


ACQ, REL, REN, INF = 0, 1, 2, 3
many = [(i, 1000 + 700 * i, 1 + i % 3) for i in range(24)]
churn = [(ACQ, 30 + i, 150, 2000, 1) for i in range(10)] + [
    (REN, 30 + i, 300, 5000, 1) for i in range(10)] + [
    (REL, 31, 500, 1, 1), (INF, 0, 1500, 1, 1), (ACQ, 45, -3000, 100, 2), (INF, 0, 0, 1, 1)]
lease_seeds = [
    ("empty", lease_case(0, [])),
    ("acquire-release", lease_case(0, [], calls=[(ACQ, 40, 0, 1000, 1), (REL, 40, 10, 1, 1)])),
    ("small-key", lease_case(0, many[:5], calls=churn)),
    ("nine-leases", lease_case(0, many[:9], calls=churn)),
    ("large-key", lease_case(0, many, calls=churn)),
    ("large-key-expiring", lease_case(0, many, calls=[(INF, 0, 3000, 1, 1)] * 8 + churn)),
    ("clock-back", lease_case(0, many, calls=[(ACQ, 41, -30000, 60000, 3), (INF, 0, 30000, 1, 1)] + churn)),
    ("retry", lease_case(0, many, calls=[(ACQ, 41, 0, 60000, 2), (ACQ, 41, 5, 60000, 2), (ACQ, 41, 5, 10, 4)])),
    ("summary-garbage", lease_case(1, many, b"x:y:z", churn)),
    ("summary-count-off", lease_case(1, many, b"24:25:0:1893456000001000:1893456000017100", churn)),
    ("summary-no-leases", lease_case(1, many[:2], b"0:0:0:1893456999000000:1893456999000000", churn)),
    ("summary-list-out-of-order", lease_case(1, many, b"48:24:2:1893456009000000:1893456017100000;1893456001700000:2:2:i1;1893456001000000:1:2:i0", churn)),
    ("summary-weight-low", lease_case(1, many, b"24:24:0:1893456099000000:1893456099000000", churn)),
    ("raw-values", lease_case(2, [b"1:0", b"01:1", b"9007199254740992:1", b":", b"1:1:1"] + many[:4], calls=churn)),
]

write("args", args)
write("state", state)
write("bucket", bucket_seeds)
write("lease", lease_seeds)
print(f"{len(args)} args, {len(state)} state, {len(bucket_seeds)} bucket, {len(lease_seeds)} lease seeds")
