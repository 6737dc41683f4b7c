"""Plots of one run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["plot_run", "pyplot", "available", "INSTALL_HINT"]

# matplotlib is an extra (`sim`), not a dependency of the broker
INSTALL_HINT = "plots need matplotlib: pip install 'mqttmesh[sim]'"


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(sim, summary: dict, out: Path) -> list[Path]:
    plt = pyplot()
    out = Path(out)
    written = []
    name = summary["scenario"]["name"]

    # 1. control and data traffic over simulated time, faults marked
    fig, ax = plt.subplots(figsize=(9, 3.6))
    bins = range(int(sim.now / sim.bin) + 1)
    t = [b * sim.bin for b in bins]
    empty = (0, 0)
    ax.plot(t, [sim.timeline.get(b, empty)[0] / sim.bin / 1024 for b in bins], label="routing control (KB/s)", lw=1)
    ax.plot(t, [sim.timeline.get(b, empty)[1] / sim.bin / 1024 for b in bins], label="forwarded messages (KB/s)", lw=1)
    for ep in summary["convergence"]:
        if ep["kind"] != "start":
            ax.axvline(ep["start"], color="red", lw=0.8, ls=":")
            ax.text(
                ep["start"], ax.get_ylim()[1] * 0.95, ep["cause"][:24], rotation=90, va="top", fontsize=7, color="red"
            )
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("mesh-wide KB/s")
    ax.set_title(f"{name}: traffic")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    written.append(_save(fig, out / "traffic.png", plt))

    # 2. convergence per fault
    eps = [e for e in summary["convergence"] if e["converged_after"] is not None]
    if eps:
        fig, ax = plt.subplots(figsize=(9, 3.6))
        labels = [e["cause"][:28] for e in eps]
        ax.bar(range(len(eps)), [e["converged_after"] for e in eps], color="tab:blue", label="from the fault")
        ax.bar(
            range(len(eps)),
            [e["after_detection"] or 0 for e in eps],
            color="tab:orange",
            width=0.5,
            label="from its detection",
        )
        for i, e in enumerate(eps):
            ax.text(i, e["converged_after"], f"{e['rounds']} rounds", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(eps)), labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("simulated seconds")
        ax.set_title(f"{name}: convergence")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(_save(fig, out / "convergence.png", plt))

    # 3. forwarded copies per message against the shortest-path-tree optimum
    steady = sim.results_steady
    if steady:
        fig, ax = plt.subplots(figsize=(5, 4.2))
        pairs: dict[tuple[int, int], int] = {}
        for copies, optimum, _d, _q in steady:
            pairs[(optimum, copies)] = pairs.get((optimum, copies), 0) + 1
        xs, ys, ss = zip(*[(o, c, n) for (o, c), n in pairs.items()], strict=False)
        ax.scatter(xs, ys, s=[8 + 4 * n**0.5 for n in ss], alpha=0.6, label="mesh (size: messages)")
        top = max(max(xs), max(ys))
        ax.plot([0, top], [0, top], color="grey", lw=0.8, ls="--", label="optimum")
        ax.axhline(summary["mqtt_st"]["copies_per_message"], color="red", lw=0.8, label="MQTT-ST (every node)")
        ax.set_xlabel("links of the shortest-path tree to the subscribers")
        ax.set_ylabel("copies forwarded")
        ax.set_title(f"{name}: copies per message")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(_save(fig, out / "copies.png", plt))
    return written


def _save(fig, path: Path, plt) -> Path:
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
