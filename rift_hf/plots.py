"""Plots of benchmark results (matplotlib, written as PNG)."""

from __future__ import annotations

from pathlib import Path


def al_by_position(accepted: list[int], bucket: int) -> list[tuple[int, float]]:
    """AL per bucket of generated-token position: `(bucket start, mean accepted + 1 of the rounds starting there)`."""
    position, buckets = 0, {}
    for a in accepted:
        buckets.setdefault(position // bucket * bucket, []).append(a + 1)
        position += a + 1
    return [(start, sum(v) / len(v)) for start, v in sorted(buckets.items())]


def plot_compare(result: dict, path: Path, bucket: int = 16) -> Path:
    """AL over generation (per policy, averaged over prompts) and retention per policy with its prompt spread."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = [s["policy"] for s in result["summary"]]
    tracked = any(r.get("attention_mass") for r in result["runs"])
    fig, axes = plt.subplots(1, 3 if tracked else 2, figsize=(16 if tracked else 11, 3.8))
    left, right = axes[0], axes[1]
    for policy in policies:
        curves = [al_by_position(r["accepted"], bucket) for r in result["runs"] if r["policy"] == policy]
        starts = sorted({x for curve in curves for x, _ in curve})
        means = [
            sum(y for curve in curves for x, y in curve if x == s)
            / sum(1 for curve in curves for x, _ in curve if x == s)
            for s in starts
        ]
        left.plot(starts, means, marker="o", ms=3, label=policy)
    left.set(title=f"AL per {bucket}-token bucket of generation", xlabel="generated tokens", ylabel="AL")
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    for i, s in enumerate(result["summary"]):
        right.bar(i, s["retention"], color="C0")
        right.errorbar(
            i,
            s["retention"],
            yerr=[[s["retention"] - s["retention_min"]], [s["retention_max"] - s["retention"]]],
            color="k",
            capsize=3,
        )
    right.set_xticks(range(len(policies)), policies, rotation=20)
    right.set(title="retention vs full (bar: ratio of mean ALs; whisker: prompt range)", ylim=(0, 1.1))
    right.grid(alpha=0.3, axis="y")
    if tracked:
        mass = axes[2]
        for policy in policies:
            runs = [r for r in result["runs"] if r["policy"] == policy and r.get("attention_mass")]
            if not runs:
                continue
            buckets: dict[int, list[float]] = {}
            for r in runs:
                for position, share in r["attention_mass"]:
                    buckets.setdefault((position - r["input_tokens"]) // bucket * bucket, []).append(share)
            xs = sorted(buckets)
            mass.plot(xs, [sum(buckets[x]) / len(buckets[x]) for x in xs], marker="o", ms=3, label=policy)
        mass.set(
            title="full-cache attention mass on kept positions",
            xlabel="generated tokens",
            ylabel="share",
            ylim=(0, 1.05),
        )
        mass.legend(fontsize=8)
        mass.grid(alpha=0.3)
    size = f"{result['compression']:g}x" if result.get("compression") else f"budget {result['budget_tokens']}"
    fig.suptitle(
        f"{result['preset']}, {size}, {result['prompts']} prompts, {result['dtype']}, "
        f"{result['machine']}, {result['date']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
