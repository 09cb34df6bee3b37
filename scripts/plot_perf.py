#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Draws the README's performance figure from `mla bench --json` output.

Usage: scripts/plot_perf.py [-o OUT.png] [JSON ...]
  JSON: files written by `mla bench --json FILE` (one run: device, date, commit, ceilings, rows) or a
  {"runs": [run, ...]} file of several (docs/perf/figures_of_record.json, the default, which adds to
  rows a `peer` {name, time_ms}: the library a user would compare with, same shape and GPU).
  OUT: default docs/perf/figures_of_record.png.

Panels, each drawn when some row has its data: speed against the peer (peer time / mla time: above 1 mla
is faster), the share of the copy ceiling of the memory-bound rows (`pct_copy`, decode), and TFLOP/s
of the rows without one (prefill). Every label carries the run's GPU, date and commit.
Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_IN = os.path.join(ROOT, "docs", "perf", "figures_of_record.json")
DEFAULT_OUT = os.path.join(ROOT, "docs", "perf", "figures_of_record.png")


def load_runs(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        found = doc.get("runs", [doc]) if isinstance(doc, dict) else None
        if not found or not all(isinstance(r, dict) and isinstance(r.get("rows"), list) for r in found):
            raise SystemExit(f"plot_perf: {p} is neither `mla bench --json` output nor a {{\"runs\": [...]}} file")
        for r in found:
            for key in ("device", "date", "commit"):
                if key not in r:
                    raise SystemExit(f"plot_perf: a run in {p} has no '{key}' (the figure names GPU, date and commit)")
        runs.extend(found)
    return runs


def rows_of(runs):
    """(label, row, run) of every row, the label naming op and configuration."""
    out = []
    for run in runs:
        for row in run["rows"]:
            if row.get("op") == "ceilings":
                continue
            out.append((f"{row['op']}  {row['config']}", row, run))
    return out


def run_tag(run):
    return f"{run['device']}, {run['date'][:10]}, {run['commit']}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="*", default=[DEFAULT_IN])
    ap.add_argument("-o", "--out", default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot_perf: matplotlib is missing (Debian: apt-get install python3-matplotlib)")

    runs = load_runs(a.json)
    rows = rows_of(runs)
    peer = [(lbl, r, run) for lbl, r, run in rows if r.get("peer") and r.get("time_ms")]
    bw = [(lbl, r, run) for lbl, r, run in rows if r.get("pct_copy")]
    compute = [(lbl, r, run) for lbl, r, run in rows if r.get("tflops") and not r.get("pct_copy")]
    panels = [p for p in (("peer", peer), ("bw", bw), ("compute", compute)) if p[1]]
    if not panels:
        raise SystemExit("plot_perf: no row has a time with a peer, a pct_copy or a tflops value to draw")

    heights = [max(1.6, 0.32 * len(p[1]) + 0.9) for p in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, sum(heights)), gridspec_kw={"height_ratios": heights},
                             squeeze=False)
    for ax, (kind, items) in zip(axes[:, 0], panels):
        labels = [lbl for lbl, _, _ in items]
        y = list(range(len(items)))[::-1]
        if kind == "peer":
            vals = [r["peer"]["time_ms"] / r["time_ms"] for _, r, _ in items]
            colors = ["tab:green" if v >= 1 else "tab:orange" for v in vals]
            ax.barh(y, vals, color=colors)
            ax.axvline(1.0, color="black", linewidth=0.8)
            for yi, v, (_, r, _) in zip(y, vals, items):
                ax.text(v, yi, f" {v:.2f}x  ({r['time_ms'] * 1e3:.0f} vs {r['peer']['name']} {r['peer']['time_ms'] * 1e3:.0f} us)",
                        va="center", fontsize=7)
            ax.set_xlabel("speed relative to the peer (peer time / mla time; > 1: mla faster)")
            ax.set_xlim(0, max(vals) * 1.6)
        elif kind == "bw":
            vals = [r["pct_copy"] for _, r, _ in items]
            ax.barh(y, vals, color="tab:blue")
            for yi, v in zip(y, vals):
                ax.text(v, yi, f" {v:.0f}%", va="center", fontsize=7)
            ax.set_xlabel("% of the measured copy bandwidth (memory-bound decode; bytes = the minimum the op moves)")
            ax.set_xlim(0, 110)
        else:
            vals = [r["tflops"] for _, r, _ in items]
            ax.barh(y, vals, color="tab:purple")
            for yi, v in zip(y, vals):
                ax.text(v, yi, f" {v:.0f}", va="center", fontsize=7)
            ax.set_xlabel("TFLOP/s (bf16 tensor cores; compute-bound prefill)")
            ax.set_xlim(0, max(vals) * 1.25)
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", alpha=0.3)
    tags = sorted({run_tag(run) for run in runs})
    fig.suptitle("mla: " + "; ".join(tags), fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    fig.savefig(a.out, dpi=110, metadata={"Software": None})
    print(f"wrote {a.out} ({sum(len(p[1]) for p in panels)} bars from {len(runs)} run(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
