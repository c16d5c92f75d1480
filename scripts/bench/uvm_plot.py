"""Plots scripts/bench/uvm.lua's JSON lines: training throughput and HBM holding the embedding
tables against the HBM allowance (a fraction of the tables' bytes), per hint policy, with the
all-in-HBM (device) run as the reference.

    python3 scripts/bench/uvm_plot.py build/bench/uvm_gpu.jsonl [out.png]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: uvm_plot.py FILE.jsonl [OUT.png]")
    path = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else path.rsplit(".", 1)[0] + ".png"
    runs = [json.loads(line) for line in open(path) if line.strip()]
    runs = [r for r in runs if r.get("bench") == "uvm"]
    if not runs:
        sys.exit(f"{path}: no uvm bench lines")
    # the last measurement of each (policy, fraction) wins: a file may hold several runs
    last = {}
    for r in runs:
        last[(r["policy"], r.get("fraction"))] = r
    device = last.get(("device", None))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for pol, style in (("hot_prefix", "o-"), ("adaptive", "s--")):
        pts = sorted((f, r) for (p, f), r in last.items() if p == pol and f is not None)
        if not pts:
            continue
        xs = [f for f, _ in pts]
        ax1.plot(xs, [r["samples_per_s"] / 1e6 for _, r in pts], style, label=f"managed, {pol}")
        ax2.plot(xs, [(r.get("bytes_on_gpu") or 0) / 1e9 for _, r in pts], style, label=f"managed, {pol}")
    host = last.get(("host", 0))
    if host:
        ax1.axhline(host["samples_per_s"] / 1e6, color="gray", ls=":", label="managed, host (nothing in HBM)")
    if device:
        ax1.axhline(device["samples_per_s"] / 1e6, color="black", label="device (all in HBM)")
        ax1.axhline(0.8 * device["samples_per_s"] / 1e6, color="black", ls="--", lw=0.8,
                    label="80% of device (B4 target)")
        tb = device["table_bytes"] / 1e9
        fr = sorted({f for (_, f) in last if f}) or [1, 100]
        ax2.plot([fr[0], 100], [tb * fr[0] / 100, tb], color="gray", ls=":", lw=0.8, label="the allowance")
        ax2.axhline(tb, color="black", label="device (all in HBM)")
    ax1.set_xlabel("HBM allowance for embeddings (% of their bytes)")
    ax1.set_ylabel("training samples/s (M)")
    ax1.set_xscale("log")
    ax1.set_ylim(bottom=0)
    ax2.set_xlabel("HBM allowance for embeddings (% of their bytes)")
    ax2.set_ylabel("embedding bytes placed in HBM (GB)")
    ax2.set_xscale("log")
    ticks = sorted({f for (_, f) in last if f})
    for ax in (ax1, ax2):
        if ticks:
            ax.set_xticks(ticks)
            ax.set_xticklabels([str(t) for t in ticks])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    r0 = runs[0]
    fig.suptitle(f"{r0['config']}, batch {r0['batch']}, {r0.get('device', '')}: managed tables under hint policies")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main()
