#!/usr/bin/env python3
"""What kernels running beside others cost them, from a ktrace timeline (scripts/bench/ktrace.c).

Steps are delimited by the starts of the kernel matching --step (by default the tables' forward
kernel).  Each kernel of the run's steps (--run A:B, step indices from 0, B excluded) is compared
with the median of the same kernel (name and grid) over the reference steps (--ref, e.g. the uvm
bench's all-in-HBM run), and put in the category of the mover (--mover LABEL=REGEX) that ran
beside it for more than half of its time, "part" where movers overlapped less, or "none".  Kernels
are grouped (--group LABEL=REGEX, the rest "dense").  Durations are summed per step: kernels on
several streams overlap, so the sums are the kernels' own time, not the step's.

  python3 scripts/bench/ktrace_overlap.py trace.csv --ref 100:140 --run 160:200
"""
import argparse
import bisect
import collections
import re
import statistics
import sys

MOVERS = ["loads=far_move\\w*kernelILb0", "home=far_move\\w*kernelILb1", "far=far_(prefetch|patch)_kernel"]
GROUPS = ["tables=_tbe_cu_|cub17CUB"]


def labelled(specs, what):
    out = []
    for s in specs:
        label, sep, rx = s.partition("=")
        if not sep or not label or not rx:
            sys.exit("ktrace_overlap: %s %r: expected LABEL=REGEX" % (what, s))
        out.append((label, re.compile(rx)))
    return out


def span(text, what):
    m = re.fullmatch(r"(\d+):(\d+)", text)
    if not m or int(m.group(1)) >= int(m.group(2)):
        sys.exit("ktrace_overlap: %s %r: expected A:B, step indices with A < B" % (what, text))
    return int(m.group(1)), int(m.group(2))


def load(path):
    kernels = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            r = line.rstrip("\n").split(",", 6)
            if r[0] != "K":
                continue
            if len(r) != 7:
                sys.exit("ktrace_overlap: %s line %d: %r; expected K,start,end,stream,blocks,threads,name"
                         % (path, n, line.rstrip("\n")[:120]))
            kernels.append({"s": int(r[1]), "e": int(r[2]), "stream": int(r[3]), "grid": int(r[4]), "name": r[6]})
    kernels.sort(key=lambda k: k["s"])
    return kernels


def short(name):
    name = re.sub(r"^_ZN\d+_GLOBAL__N__\w+?_cu_\w{8}\d+", "", name)
    return re.sub(r"^_Z[N]?\d+", "", name)[:56]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--ref", required=True, help="reference steps A:B")
    ap.add_argument("--run", required=True, help="the steps taken apart, A:B")
    ap.add_argument("--step", default=r"_tbe_cu_\w*fwd_kernel", help="the kernel each step begins with (regex)")
    ap.add_argument("--mover", action="append", help="LABEL=REGEX (default: %s)" % ", ".join(MOVERS))
    ap.add_argument("--group", action="append", help="LABEL=REGEX (default: %s)" % ", ".join(GROUPS))
    ap.add_argument("--top", type=int, default=12, help="kernels listed by their excess")
    o = ap.parse_args()
    movers, groups = labelled(o.mover or MOVERS, "--mover"), labelled(o.group or GROUPS, "--group")
    ref, run = span(o.ref, "--ref"), span(o.run, "--run")
    kernels = load(o.trace)
    step_re = re.compile(o.step)
    starts = [k["s"] for k in kernels if step_re.search(k["name"])]
    if max(ref[1], run[1]) >= len(starts):
        sys.exit("ktrace_overlap: %s holds %d kernels matching '%s' (each begins a step, which ends where the "
                 "next begins); --ref %s and --run %s need %d" % (o.trace, len(starts), o.step, o.ref, o.run,
                                                                  max(ref[1], run[1]) + 1))

    def steps(a, b):
        return [(starts[i], starts[i + 1]) for i in range(a, b)]

    def mover_of(k):
        return next((label for label, rx in movers if rx.search(k["name"])), None)

    def group_of(k):
        return next((label for label, rx in groups if rx.search(k["name"])), "dense")

    ref_steps, run_steps = steps(*ref), steps(*run)

    # a kernel is the n-th of its name and grid in its step: layers that share a kernel differ
    def keyed(first, last):
        seen = collections.defaultdict(collections.Counter)
        for k in kernels:
            i = bisect.bisect_right(starts, k["s"]) - 1
            if first <= i < last and not mover_of(k):
                seen[i][(k["name"], k["grid"])] += 1
                yield (k["name"], k["grid"], seen[i][(k["name"], k["grid"])]), k

    # the times some kernel other than a mover runs (on any stream, or on the steps' own: that of
    # the kernel each step begins with), merged into (start, end) runs
    def merged(keep):
        runs = []
        for k in kernels:
            if mover_of(k) or not keep(k):
                continue
            if runs and k["s"] <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], k["e"])
            else:
                runs.append([k["s"], k["e"]])
        return runs, [r[0] for r in runs]

    step_stream = next(k["stream"] for k in kernels if step_re.search(k["name"]))
    busy_any, busy_own = merged(lambda k: True), merged(lambda k: k["stream"] == step_stream)

    def idle_us(busy, a, b):
        runs, run_starts = busy
        j = max(0, bisect.bisect_right(run_starts, a) - 1)
        t = 0
        while j < len(runs) and runs[j][0] < b:
            t += max(0, min(b, runs[j][1]) - max(a, runs[j][0]))
            j += 1
        return (b - a - t) / 1e3

    def median_idle(busy, windows):
        return statistics.median([idle_us(busy, a, b) for a, b in windows])

    base = collections.defaultdict(list)
    for key, k in keyed(*ref):
        base[key].append(k["e"] - k["s"])
    base = {key: statistics.median(v) for key, v in base.items()}
    lo, hi = run_steps[0][0], run_steps[-1][1]
    moving = [k for k in kernels if mover_of(k) and k["e"] > lo and k["s"] < hi]
    nsteps = len(run_steps)
    def step_ms(windows):
        return statistics.median([(b - a) / 1e6 for a, b in windows])

    print("%s: step (median) %.3f ms in the reference steps %s, %.3f ms in the run's %s"
          % (o.trace, step_ms(ref_steps), o.ref, step_ms(run_steps), o.run))
    print("  no kernel but the movers running: %.0f us a step (median) in the reference, %.0f in the run"
          % (median_idle(busy_any, ref_steps), median_idle(busy_any, run_steps)))
    print("  the steps' stream (%d) idle: %.0f us a step (median) in the reference, %.0f in the run"
          % (step_stream, median_idle(busy_own, ref_steps), median_idle(busy_own, run_steps)))
    for label, _ in movers:
        mine = [k for k in moving if mover_of(k) == label]
        at = [(k["s"] - a, k["e"] - a) for k in mine for a, b in run_steps if a <= k["s"] < b]
        if at:
            print("  %s: %d kernels, %.0f us each (median), from %.0f to %.0f us after their step's start"
                  % (label, len(mine), statistics.median([(k["e"] - k["s"]) / 1e3 for k in mine]),
                     statistics.median([s for s, _ in at]) / 1e3, statistics.median([e for _, e in at]) / 1e3))
    cats = collections.defaultdict(lambda: [0, 0.0, 0.0])
    each = collections.defaultdict(lambda: [0, 0.0, 0.0])
    unmatched = 0
    for key, k in keyed(*run):
        if key not in base:
            unmatched += 1
            continue
        d = k["e"] - k["s"]
        beside = collections.Counter()
        for m in moving:
            beside[mover_of(m)] += max(0, min(k["e"], m["e"]) - max(k["s"], m["s"]))
        label, t = beside.most_common(1)[0] if beside else (None, 0)
        cat = "%s beside %s" % (group_of(k), label if t > d / 2 else "part" if sum(beside.values()) else "none")
        for acc in (cats[cat], each[(short(k["name"]), cat)]):
            acc[0] += 1
            acc[1] += d / 1e3
            acc[2] += (d - base[key]) / 1e3
    print("  a step: kernels, their time (us) and its excess over the reference's (us)")
    for cat, (n, t, x) in sorted(cats.items()):
        print("    %-22s %6.1f %9.1f %+9.1f" % (cat, n / nsteps, t / nsteps, x / nsteps))
    if unmatched:
        print("  (%d kernels of the run have no reference: left out)" % unmatched)
    print("  the kernels slowed most, a step (us): excess, time, category, kernel")
    for (name, cat), (n, t, x) in sorted(each.items(), key=lambda kv: -kv[1][2])[:o.top]:
        print("    %+8.1f %8.1f  %-22s %s" % (x / nsteps, t / nsteps, cat, name))


if __name__ == "__main__":
    main()
