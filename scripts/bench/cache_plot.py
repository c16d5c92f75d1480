"""Hit rate against cache size from the cache benchmark's JSON lines (scripts/bench/cache.lua):
one line per policy (LRU, LFU), solid without prefetch and dashed with it, and the conflict
misses (rows served from staging) underneath.

    python3 scripts/bench/cache_plot.py cache.jsonl --out cache.png
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("cache_plot: matplotlib is not installed (apt-get install python3-matplotlib)")
    rows = []
    try:
        for line in open(a.jsonl):
            r = json.loads(line)
            if r.get("bench") == "cache_hit_rate":
                rows.append(r)
    except (OSError, ValueError) as e:
        sys.exit(f"cache_plot: {a.jsonl}: {e}")
    if not rows:
        sys.exit(f"cache_plot: {a.jsonl}: no cache_hit_rate lines")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    colours = {"lru": "tab:blue", "lfu": "tab:orange"}
    for policy in ("lru", "lfu"):
        for prefetch in (False, True):
            pts = sorted((r["cache_fraction"], r["hit_rate"], r["conflict_rate"]) for r in rows
                         if r["policy"] == policy and r["prefetch"] == prefetch)
            if not pts:
                continue
            x = [100 * p[0] for p in pts]
            style = "--" if prefetch else "-"
            label = f"{policy.upper()}{' + prefetch' if prefetch else ''}"
            top.plot(x, [100 * p[1] for p in pts], style, marker="o", color=colours[policy], label=label)
            bottom.plot(x, [100 * p[2] for p in pts], style, marker=".", color=colours[policy], label=label)
    r0 = rows[0]
    top.set_title(f"{r0['tables']} tables x {r0['rows']:,} rows, Zipf({r0['zipf']}) ids, "
                  f"batch {r0['batch']:,}")
    top.set_ylabel("hit rate (% of distinct rows per batch)")
    top.grid(True, which="both", alpha=0.3)
    top.legend()
    bottom.set_ylabel("conflict misses (%)")
    bottom.set_xlabel("cache size (% of the rows)")
    bottom.set_xscale("log")
    bottom.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)


if __name__ == "__main__":
    main()
