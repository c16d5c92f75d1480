"""Hit rate against cache size (BENCH.md B6) from the cache benchmarks' JSON lines.

scripts/bench/cache_warm.lua's lines ("cache_warm"): for LRU and LFU, the hit rate over the
batch's distinct rows as the cache counts it (first touches included: rows never read before,
which no cache can hit) and the warm hit rate (hits over the rows read before), measured
(markers: circles, triangles with prefetch; filled warm, hollow all) and predicted by the planner's model (lines), with the first
touches' share underneath.  scripts/bench/cache.lua's older lines ("cache_hit_rate") are drawn
as before: hit rate and conflict misses.

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
    warm, old = [], []
    try:
        for line in open(a.jsonl):
            r = json.loads(line)
            if r.get("bench") == "cache_warm":
                warm.append(r)
            elif r.get("bench") == "cache_hit_rate":
                old.append(r)
    except (OSError, ValueError) as e:
        sys.exit(f"cache_plot: {a.jsonl}: {e}")
    if not warm and not old:
        sys.exit(f"cache_plot: {a.jsonl}: no cache_warm or cache_hit_rate lines")
    colours = {"lru": "tab:blue", "lfu": "tab:orange"}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    if warm:
        for policy in ("lru", "lfu"):
            for prefetch in (False, True):
                pts = sorted((r["cache_fraction"], r) for r in warm
                             if r["policy"] == policy and r["prefetch"] == prefetch)
                if not pts:
                    continue
                x = [100 * p[0] for p in pts]
                rs = [p[1] for p in pts]
                ls = "--" if prefetch else "-"
                tag = policy.upper() + (" + prefetch" if prefetch else "")
                c = colours[policy]
                mk = "^" if prefetch else "o"
                top.plot(x, [100 * r["warm_hit_rate"] for r in rs], mk, color=c, mfc=c,
                         label=f"{tag}: warm (hits / rows read before)")
                top.plot(x, [100 * r["hit_rate"] for r in rs], mk, color=c, mfc="none",
                         label=f"{tag}: all (hits / distinct rows)")
                if not prefetch:
                    top.plot(x, [100 * r["model_warm_hit_rate"] for r in rs], ls, color=c, lw=1.2,
                             label=f"{policy.upper()} model, warm")
                    top.plot(x, [100 * r["model_hit_rate"] for r in rs], ls, color=c, lw=0.8, alpha=0.6,
                             label=f"{policy.upper()} model, all")
                    top.plot(x, [100 * r["model_steady"] for r in rs], ":", color=c, lw=1,
                             label=f"{policy.upper()} model, warm for ever (the planner's)")
                    bottom.plot(x, [100 * r["first_touch"] for r in rs], "o", color=c, label=f"{policy.upper()}")
                    bottom.plot(x, [100 * r["model_first_touch"] for r in rs], "-", color=c, lw=0.8)
        r0 = warm[0]
        top.set_title(f"{r0['tables']} tables x {r0['rows']:,} rows, Zipf({r0['zipf']}) ids, batch {r0['batch']:,}; "
                      f"{r0['warm']} batches warm, {r0['batches'] - r0['warm']} measured; LFU decay {r0.get('decay', 0)}",
                      fontsize=9)
        bottom.set_ylabel("first touches (%)")
        bottom.set_ylim(0, 1.5 * max(100 * r["first_touch"] for r in warm))
    else:
        for policy in ("lru", "lfu"):
            for prefetch in (False, True):
                pts = sorted((r["cache_fraction"], r["hit_rate"], r["conflict_rate"]) for r in old
                             if r["policy"] == policy and r["prefetch"] == prefetch)
                if not pts:
                    continue
                x = [100 * p[0] for p in pts]
                style = "--" if prefetch else "-"
                label = f"{policy.upper()}{' + prefetch' if prefetch else ''}"
                top.plot(x, [100 * p[1] for p in pts], style, marker="o", color=colours[policy], label=label)
                bottom.plot(x, [100 * p[2] for p in pts], style, marker=".", color=colours[policy], label=label)
        r0 = old[0]
        top.set_title(f"{r0['tables']} tables x {r0['rows']:,} rows, Zipf({r0['zipf']}) ids, batch {r0['batch']:,}")
        bottom.set_ylabel("conflict misses (%)")
    top.set_ylabel("hit rate (%)")
    top.grid(True, which="both", alpha=0.3)
    top.legend(fontsize=7, ncol=2, loc="lower right")
    bottom.set_xlabel("cache size (% of the rows)")
    bottom.set_xscale("log")
    bottom.grid(True, which="both", alpha=0.3)
    bottom.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)


if __name__ == "__main__":
    main()
