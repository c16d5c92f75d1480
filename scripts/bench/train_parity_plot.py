"""Loss curves of a training-parity run (scripts/bench/train_parity.lua) in one PNG: uvmrec's run
log (metrics.jsonl) and the PyTorch DLRM's (torch_dlrm.py train --out), the loss of each logged
step (thin) and its running mean over --smooth points (thick), with the final AUCs.

    python3 scripts/bench/train_parity_plot.py UVMREC.jsonl TORCH.jsonl --out loss.png [--title T]
"""
import argparse
import json
import sys


def curve(path):
    steps, losses, auc = [], [], None
    try:
        for line in open(path):
            r = json.loads(line)
            if r.get("event") == "train":
                steps.append(r["step"])
                losses.append(r["loss"])
            elif r.get("event") == "final" and r.get("auc") is not None:
                auc = r["auc"]
    except (OSError, ValueError) as e:
        sys.exit(f"train_parity_plot: {path}: {e}")
    if not steps:
        sys.exit(f"train_parity_plot: {path}: no train lines")
    return steps, losses, auc


def running_mean(v, k):
    out, s = [], 0.0
    for i, x in enumerate(v):
        s += x
        if i >= k:
            s -= v[i - k]
        out.append(s / min(i + 1, k))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("uvmrec")
    ap.add_argument("torch")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="training parity")
    ap.add_argument("--smooth", type=int, default=20)
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("train_parity_plot: matplotlib is not installed (build/venv/bin/pip install matplotlib)")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    # PyTorch dashed over uvmrec: where the runs agree both stay visible.
    for path, name, color, style in ((a.uvmrec, "uvmrec", "tab:blue", "-"), (a.torch, "PyTorch", "tab:orange", "--")):
        s, l, auc = curve(path)
        ax.plot(s, l, color=color, alpha=0.3, linewidth=0.7, linestyle=style)
        label = f"{name}" + (f" (AUC {auc:.4f})" if auc is not None else "")
        ax.plot(s, running_mean(l, a.smooth), color=color, linewidth=2.2 if style == "-" else 1.5,
                linestyle=style, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss (BCE; thick: mean of {a.smooth} logged steps)")
    ax.set_title(a.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"train_parity_plot: wrote {a.out}")


if __name__ == "__main__":
    main()
