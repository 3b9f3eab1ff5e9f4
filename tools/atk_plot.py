#!/usr/bin/env python3
"""PNG plots of a `strata atk` report (ARCHITECTURE.md §9): time over the floor per benchmark case and the
worst precision err/bound per op.

    python tools/atk_plot.py atk_report/atk.json        # writes atk_report/atk_perf.png, atk_precision.png

Needs matplotlib (headless: the Agg backend); prints a line and exits 0 when it is missing, so the main job
never fails for want of a plot."""
import json
import os
import sys


def main(path: str) -> int:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("atk_plot: matplotlib is not installed; no PNG written")
        return 0
    with open(path) as f:
        report = json.load(f)
    out_dir = os.path.dirname(os.path.abspath(path))
    device = report.get("device", {})
    title = f"strata atk {report.get('date', '')} on {device.get('name', device) if isinstance(device, dict) else device}"

    rows = [b for op in report["ops"] for b in op.get("bench", []) if "floor_ratio" in b]
    if rows:
        fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
        labels = [b["label"] for b in rows]
        ratios = [b["floor_ratio"] for b in rows]
        ax.barh(labels, ratios, color=["tab:green" if r <= 1.1 else "tab:orange" if r <= 1.5 else "tab:red"
                                       for r in ratios])
        ax.axvline(1.0, color="black", linewidth=1)
        ax.axvline(1.1, color="gray", linestyle="--", linewidth=1)
        ax.invert_yaxis()
        ax.set_xlabel("median time / floor (floor = bytes / copy bandwidth measured alongside)")
        ax.set_title(title)
        for y, r in enumerate(ratios):
            ax.text(r, y, f" {r:.2f}", va="center", fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "atk_perf.png"), dpi=110)
        plt.close(fig)

    ops = [op for op in report["ops"] if op.get("precision")]
    if ops:
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(ops) + 1.5))
        worst = [op["precision"]["worst_err_over_bound"] for op in ops]
        worst = [w if isinstance(w, (int, float)) else float("inf") for w in worst]
        ax.barh([op["op"] for op in ops], worst, color=["tab:green" if w <= 1 else "tab:red" for w in worst])
        ax.axvline(1.0, color="black", linewidth=1)
        ax.invert_yaxis()
        ax.set_xlabel("worst error / acceptance bound over the op's cases (pass: <= 1)")
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "atk_precision.png"), dpi=110)
        plt.close(fig)
    print(f"atk_plot: wrote PNGs next to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "atk_report/atk.json"))
