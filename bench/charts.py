#!/usr/bin/env python3
"""Draws the charts docs/benchmarks.md opens with, from the figures the
document itself records (each bench writes its own section), and writes
the one-screen summary beside them. So a chart never shows a figure the
tables below don't.

    python3 bench/charts.py [docs/benchmarks.md] [docs/img]

Needs matplotlib (`make charts` installs it in target/bench-venv). A
chart whose bench has not written its section yet is left as it was.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

from doc_section import write_section  # noqa: E402

# Reproducible files: no date, fixed ids.
plt.rcParams["svg.hashsalt"] = "redis-tokenbucket"
plt.rcParams["svg.fonttype"] = "none"
plt.rcParams["font.size"] = 10
METADATA = {"Date": None, "Creator": "bench/charts.py"}
OURS, PEER, LUA, REF = "#1f6feb", "#9a6700", "#8250df", "#6e7781"


# ---- reading the document -------------------------------------------------------


def section(doc: str, name: str) -> str:
    """The text between a bench's markers, or ''."""
    found = re.search(rf"<!-- {name}:begin -->(.*?)<!-- {name}:end -->", doc, re.S)
    return found.group(1) if found else ""


def block(doc: str, heading: str) -> str:
    """The text under a heading (`### name`), up to the next heading."""
    found = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#)", doc, re.S | re.M)
    return found.group(1) if found else ""


def tables(text: str) -> list[list[dict[str, str]]]:
    """Every Markdown table of `text`, as rows keyed by the header's cells."""
    out: list[list[dict[str, str]]] = []
    lines = text.splitlines()
    i = 0
    while i + 1 < len(lines):
        head, rule = lines[i], lines[i + 1]
        if head.startswith("|") and re.match(r"^\|[-:| ]+\|$", rule.strip()):
            keys = [c.strip() for c in head.strip().strip("|").split("|")]
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                rows.append(dict(zip(keys, cells)))
                i += 1
            out.append(rows)
        else:
            i += 1
    return out


def num(cell: str | None) -> float | None:
    """The first number of a cell: 1,234, 28.6k, 1.53x, +47, -11."""
    if not cell:
        return None
    found = re.search(r"[-+]?\d[\d,]*(?:\.\d+)?k?", cell)
    if not found:
        return None
    text = found.group(0).replace(",", "")
    return float(text[:-1]) * 1000 if text.endswith("k") else float(text)


def save(fig: plt.Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata=METADATA)
    plt.close(fig)


# ---- the charts -------------------------------------------------------------------


def tb_consume(doc: str, out: Path) -> list[str] | None:
    """TB.CONSUME's whole-server instructions against CL.THROTTLE and HSET."""
    rows = {r["command"]: r for t in tables(block(doc, "Instructions per command (callgrind)")) for r in t}
    whole = "instructions, whole server"
    cases = [("admitted,\nnew keys", "admitted, random keys"),
             ("admitted,\n10,000 existing", "admitted, 10,000 existing buckets"),
             ("denied,\nhot key", "denied, hot key")]  # fmt: skip
    ours = [num(rows.get(f"TB.CONSUME {c}", {}).get(whole)) for _, c in cases]
    cell = [num(rows.get(f"CL.THROTTLE {c} (redis-cell)", {}).get(whole)) for _, c in cases]
    hset = num(rows.get("HSET", {}).get(whole))
    if not all(ours) or hset is None:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    x = range(len(cases))
    ax.bar([i - 0.2 for i in x], ours, 0.4, label="TB.CONSUME", color=OURS)
    if all(cell):
        ax.bar([i + 0.2 for i in x], cell, 0.4, label="CL.THROTTLE (redis-cell)", color=PEER)
    ax.axhline(hset, color=REF, linestyle="--", linewidth=1)
    ax.text(len(cases) - 0.5, hset, " HSET", va="bottom", ha="right", color=REF)
    ax.set_xticks(list(x), [c for c, _ in cases])
    ax.set_ylabel("instructions per call, whole server")
    ax.set_title("TB.CONSUME against redis-cell and plain HSET (callgrind)")
    ax.set_ylim(0, max(v for v in ours + cell + [hset] if v) * 1.3)
    ax.legend(frameon=False, loc="upper left", ncol=2)
    save(fig, out / "tb-consume.svg")
    ratio = f"{ours[0] / cell[0]:.2f}x" if all(cell) else "—"
    return [f"| TB.CONSUME, new keys, against redis-cell's CL.THROTTLE | {ratio} the instructions |"]


def leases(doc: str, out: Path) -> list[str] | None:
    """A lease pair's cost against the key's live leases."""
    found = [t for t in tables(section(doc, "bench-leases")) if t and "instructions per pair" in t[0]]
    if not found:
        return None
    series: dict[str, list[tuple[float, float]]] = {}
    for r in found[0]:
        live, instr = num(r["live leases"]), num(r["instructions per pair"])
        if live and instr:
            series.setdefault(r["semaphore"], []).append((live, instr))
    if "module" not in series:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for name, color, label in [("module", OURS, "TB.ACQUIRE + TB.RELEASE (module)"),
                               ("FCALL", LUA, "tb_acquire + tb_release (Lua library)"),
                               ("zset script", PEER, "sorted-set recipe")]:  # fmt: skip
        points = sorted(series.get(name, []))
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=color, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("live leases on the key")
    ax.set_ylabel("instructions per pair, whole server")
    ax.set_title("A lease pair's cost against the key's live leases")
    ax.legend(frameon=False, fontsize=8)
    save(fig, out / "leases.svg")
    module = sorted(series["module"])
    return [f"| a module lease pair, {module[-1][0]:,.0f} live leases against 1 | "
            f"{module[-1][1] / module[0][1]:.2f}x the instructions |"]  # fmt: skip


def gateways(doc: str, out: Path) -> list[str] | None:
    """Admitted against connections, as a share of the exact budget."""
    lines: dict[str, list[tuple[float, float]]] = {}
    for t in tables(section(doc, "bench-gateway")):
        for r in t:
            if "admitted" in r and "exact budget" in r and r.get("backend"):
                c, a, b = num(r["connections"]), num(r["admitted"]), num(r["exact budget"])
                if c and a is not None and b:
                    lines.setdefault(f"FastAPI gateway, {r['backend']}", []).append((c, a / b))
    for t in tables(section(doc, "bench-nginx")):
        for r in t:
            name = r.get("limiter", "")
            if name in ("gateway", "limit_req") and r.get("nodes") in ("1", "2"):
                c, a, b = num(r["connections"]), num(r["admitted"]), num(r["exact budget"])
                label = "nginx gateway" if name == "gateway" else "nginx limit_req (per node)"
                if c and a is not None and b:
                    lines.setdefault(f"{label}, {r['nodes']} node(s)", []).append((c, a / b))
    if not lines:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for name, points in sorted(lines.items()):
        points = sorted(points)
        style = "--" if "limit_req" in name else "-"
        ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=name)
    ax.axhline(1.0, color=REF, linewidth=1)
    ax.text(ax.get_xlim()[0], 1.0, " the exact budget", va="bottom", color=REF)
    ax.set_xlabel("connections")
    ax.set_ylabel("admitted / exact budget")
    ax.set_title("What the gateways admit under load")
    ax.legend(frameon=False, fontsize=7)
    save(fig, out / "gateways.svg")
    ours = [v for name, points in lines.items() if "limit_req" not in name for _, v in points]
    local = [v for name, points in lines.items() if "2 node" in name and "limit_req" in name for _, v in points]
    rows = [f"| the FastAPI and nginx gateways, admitted against the exact budget, every load | at most {max(ours):.2f}x |"]
    if local:
        rows.append(f"| nginx's own limit_req on two nodes, the same load | {max(local):.2f}x |")
    return rows


def clients(doc: str, out: Path) -> list[str] | None:
    """Each client's decisions/s against its peers."""
    bars: list[tuple[str, float, str]] = []
    for t in tables(section(doc, "bench-peers")):
        for r in t:
            case, value = r.get("case", ""), num(r.get("decisions/s"))
            if value and case in ("ours sync", "limits fixed window", "ours asyncio", "limits.aio fixed window"):
                label = case.replace("ours", "Python:").replace("limits", "limits:")
                bars.append((label, value, OURS if case.startswith("ours") else PEER))
    for t in tables(section(doc, "node-bench")):
        for r in t:
            if r.get("case", "").startswith("decisions/s, 50 in flight"):
                cols = [k for k in r if k != "case"]
                for k in cols:
                    value = num(r[k])
                    if value:
                        bars.append((f"Node: {k.split('`')[0].strip()}", value, OURS if "redis-tokenbucket" in k else PEER))
    if not bars:
        return None
    value = {label: v for label, v, _ in bars}
    rows = []
    for ours, peer, what in [("Python: sync", "limits: fixed window", "Python, sync, against limits"),
                             ("Python: asyncio", "limits:.aio fixed window", "Python, asyncio, against limits.aio"),
                             ("Node: redis-tokenbucket (module)", "Node: rate-limiter-flexible",
                              "Node, 50 in flight, against rate-limiter-flexible")]:  # fmt: skip
        if value.get(ours) and value.get(peer):
            rows.append(f"| {what} | {value[ours] / value[peer]:.2f}x the decisions/s |")
    fig, ax = plt.subplots(figsize=(6.4, 0.45 * len(bars) + 1.0))
    ax.barh(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("decisions/s (one process)")
    ax.set_title("The clients against their peers")
    save(fig, out / "clients.svg")
    return rows


def main() -> None:
    doc_path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks.md")
    out = Path(sys.argv[2] if len(sys.argv) > 2 else doc_path.parent / "img")
    out.mkdir(parents=True, exist_ok=True)
    doc = doc_path.read_text()
    summary: list[str] = []
    drawn = []
    for chart in (tb_consume, leases, gateways, clients):
        rows = chart(doc, out)
        summary += rows or []
        drawn.append(chart.__name__)
    images = "\n".join(
        f"![{alt}](img/{name}.svg)"
        for alt, name in [
            ("TB.CONSUME against redis-cell's CL.THROTTLE and HSET", "tb-consume"),
            ("A lease pair's cost against the key's live leases", "leases"),
            ("What the gateways admit under load, against the exact budget", "gateways"),
            ("Each client's decisions per second against its peers", "clients"),
        ]
        if (out / f"{name}.svg").exists()
    )
    body = "\n".join(["", images, "", "| at a glance | |", "|---|---|", *summary, ""])
    write_section(doc_path, "bench-summary", body)
    print(f"charts in {out}; summary in {doc_path}")


if __name__ == "__main__":
    main()
