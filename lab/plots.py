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

    # Policies with per-round records (a `transformers` baseline row has none: no curve, no retention bar).
    summary = [s for s in result["summary"] if s.get("retention") is not None]
    policies = [s["policy"] for s in summary]
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
    for i, s in enumerate(summary):
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


def headline_records(records: list[dict]) -> list[dict]:
    """
    The records of each experiment's largest runs, per preset: replay records where it has any (they cover the most
    prompts), then only those of the settings with the most prompts. In E1, a policy label with overrides
    (`rift-dyn@tokens_ahead=128`) stays only where its policy has no plain label in that setting.
    """
    kept = []
    for experiment, preset in dict.fromkeys((r["experiment"], r["preset"]) for r in records):
        mine = [r for r in records if (r["experiment"], r["preset"]) == (experiment, preset)]
        mine = [r for r in mine if r.get("method") == "replay"] or mine
        most = max(r.get("prompts") or 0 for r in mine)
        mine = [r for r in mine if (r.get("prompts") or 0) == most]
        if experiment == "E1":
            setting = ("compression", "input_tokens", "output_tokens")
            plain = {(*(r[k] for k in setting), r["policy"]) for r in mine if "@" not in r["policy"]}
            mine = [
                r for r in mine if "@" not in r["policy"]
                or (*(r[k] for k in setting), r["policy"].split("@")[0]) not in plain
            ]  # fmt: skip
        kept += mine
    return kept


def plot_summary(records: list[dict], path: Path) -> Path:
    """One figure over `summary.json` (`headline_records` of it: each experiment's largest runs): E1 retention per
    policy, E3 input-length sweep, E4 Δ sweep, E5 ada vs dyn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = headline_records(records)

    def of(experiment):
        return [r for r in records if r["experiment"] == experiment]

    panels = [name for name in ("E1", "E3", "E4", "E5") if of(name)]
    if not panels:
        raise ValueError(
            "summary.json holds no E1, E3, E4 or E5 records: run `python -m benchmarks.experiments` first."
        )
    count = len(panels) + ("E3" in panels)
    columns, lines = min(count, 3), -(-count // 3)
    fig, grid = plt.subplots(lines, columns, figsize=(5.4 * columns, 4.0 * lines), squeeze=False)
    axes = [ax for row in grid for ax in row]
    for ax in axes[count:]:
        ax.set_visible(False)
    presets = list(dict.fromkeys(r["preset"] for r in records))
    styles = {preset: style for preset, style in zip(presets, ("-", "--", ":", "-."), strict=False)}
    if "E1" in panels:
        ax = axes.pop(0)
        rows = [r for r in of("E1") if r["policy"] != "full"]
        policies = list(dict.fromkeys(r["policy"] for r in rows))
        # One group of bars per run setting: the same preset and compression at another length is another group.
        setting = ("preset", "compression", "input_tokens", "output_tokens", "prompts")
        groups = list(dict.fromkeys(tuple(r.get(k) for k in setting) for r in rows))
        width = 0.8 / len(groups)
        for g, group in enumerate(groups):
            values = {r["policy"]: r["retention"] for r in rows if tuple(r.get(k) for k in setting) == group}
            preset, compression, input_tokens, output_tokens, prompts = group
            label = f"{preset} {compression:g}x, {input_tokens / 1024:.0f}K in, {output_tokens} out, {prompts or '?'}p"
            xs = [i + g * width for i, p in enumerate(policies) if p in values]
            ax.bar(xs, [values[p] for p in policies if p in values], width, label=label)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(policies))], policies, rotation=25, fontsize=8)
        ax.set(title="E1 retention vs full cache", ylim=(0, 1.4))
        ax.axhline(1.0, color="k", lw=0.5)
        ax.legend(fontsize=6, loc="upper center", ncol=2)
        ax.grid(alpha=0.3, axis="y")
    if "E3" in panels:
        retention, cost = axes.pop(0), axes.pop(0)
        for preset in presets:
            for policy in dict.fromkeys(r["policy"] for r in of("E3")):
                rows = sorted(
                    (r for r in of("E3") if r["preset"] == preset and r["policy"] == policy),
                    key=lambda r: r["input_tokens"],
                )
                if not rows:
                    continue
                xs = [r["input_tokens"] for r in rows]
                if policy != "full":
                    retention.plot(
                        xs, [r["retention"] for r in rows], styles[preset], marker="o", label=f"{preset} {policy}"
                    )
                timed = [r for r in rows if r.get("draft_ms_per_token") is not None]  # replay records carry no time
                if timed:
                    cost.plot(
                        [r["input_tokens"] for r in timed],
                        [r["draft_ms_per_token"] for r in timed],
                        styles[preset],
                        marker="o",
                        label=f"{preset} {policy}",
                    )
        retention.set(title="E3 retention at a fixed token budget", xlabel="input tokens", ylim=(0, 1.1), xscale="log")
        cost.set(title="E3 drafter decode ms/token", xlabel="input tokens", xscale="log")
        for ax in (retention, cost):
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
    if "E4" in panels:
        ax = axes.pop(0)
        share = ax.twinx()
        for preset in presets:
            rows = [r for r in of("E4") if r["preset"] == preset and "delta=" in r["policy"]]
            deltas = {r["policy"]: int(r["policy"].rsplit("delta=", 1)[1].split(",")[0]) for r in rows}
            rows.sort(key=lambda r: deltas[r["policy"]])
            xs = [deltas[r["policy"]] for r in rows]
            ax.plot(
                xs, [r["retention"] for r in rows], styles[preset], marker="o", color="C0", label=f"{preset} retention"
            )
            share.plot(
                xs,
                [r["rescore_share"] for r in rows],
                styles[preset],
                marker="s",
                color="C3",
                label=f"{preset} rescore share",
            )
        ax.set(title="E4 rift-dyn Δ sweep", xlabel="Δ (tokens)", xscale="log", ylim=(0, 1.1), ylabel="retention")
        share.set_ylabel("rescoring time / drafter time", color="C3")
        ax.legend(fontsize=7, loc="lower left")
        share.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
    if "E5" in panels:
        ax = axes.pop(0)
        # The calibration runs (rift-dyn@delta=..., with their own full baseline) stay out.
        calibration = {(r["preset"], r["input_tokens"]) for r in of("E5") if r["policy"].startswith("rift-dyn@")}
        rows = [r for r in of("E5") if (r["preset"], r["input_tokens"]) not in calibration]
        labels = [f"{r['preset']}\n{r['policy'].split('@')[0]}" for r in rows]
        ax.bar(range(len(rows)), [r["al"] for r in rows], color="C2")
        for i, r in enumerate(rows):
            if r.get("rescorings") is not None:
                ax.annotate(f"{r['rescorings']:.0f} resc.", (i, r["al"]), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=30)
        ax.set(title="E5 rift-ada (calibrated) vs rift-dyn: AL", ylabel="AL")
        ax.grid(alpha=0.3, axis="y")
    where = "; ".join(", ".join(sorted({str(r[k]) for r in records})) for k in ("machine", "dtype", "date"))
    fig.suptitle(f"rift-hf experiments ({where})", fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_regimes(rows: list[dict], path: Path) -> Path:
    """Per-prompt retention of every policy (`tables.regime_rows`), one panel per compression (or budget), one
    colour per regime, the mean as a bar outline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(r["size"] for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 3.8), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        for t, task in enumerate(tasks):
            for i, policy in enumerate(policies):
                match = [r for r in rows if (r["size"], r["policy"], r["task"]) == (size, policy, task)]
                if not match:
                    continue
                x = i + (t - (len(tasks) - 1) / 2) * 0.3
                ratios = match[0]["per_prompt"]
                ax.scatter([x] * len(ratios), ratios, s=12, color=f"C{t}", alpha=0.7, label=task if i == 0 else None)
                ax.bar(x, match[0]["retention"], width=0.28, fill=False, edgecolor=f"C{t}")
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_xticks(range(len(policies)), policies, rotation=20)
        ax.set(title=f"{size}: retention per prompt (outline: mean)", ylim=(0, 1.25))
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_staleness(rows: list[dict], path: Path) -> Path:
    """E2's picture (`tables.staleness_rows`): one row of panels per compression (or budget) and regime, AL and
    the kept share of full-cache attention mass over generation, one line per policy (`full` in black)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["size"], r["task"]) for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(len(panels), 2, figsize=(10, 3.4 * len(panels)), squeeze=False)
    for (al_ax, mass_ax), (size, task) in zip(axes, panels, strict=True):
        for i, policy in enumerate(policies):
            match = [r for r in rows if (r["size"], r["policy"], r["task"]) == (size, policy, task)]
            if not match:
                continue
            r, style = match[0], dict(color="k" if policy == "full" else f"C{i}", marker="o", ms=3, label=policy)
            al_ax.plot(*zip(*r["al_curve"], strict=True), **style)
            if policy != "full" and r["mass_curve"]:
                mass_ax.plot(*zip(*r["mass_curve"], strict=True), **style)
        n = max(r["prompts"] for r in rows if (r["size"], r["task"]) == (size, task))
        al_ax.set(title=f"{size}, {task} ({n} prompts): AL", xlabel="generated tokens", ylabel="AL")
        mass_ax.set(
            title=f"{size}, {task}: share of full-cache attention mass kept",
            xlabel="generated tokens",
            ylabel="share",
            ylim=(0, 1.02),
        )
        for ax in (al_ax, mass_ax):
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:  # a regime replayed without --attention-mass has no mass lines
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_input_sweep(rows: list[dict], path: Path) -> Path:
    """E3's picture: retention against input length (`tables.regime_rows` of several replay folders, one per input
    length), one panel per regime, one line per policy and budget, each prompt a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in rows))
    lines = list(dict.fromkeys((r["policy"], r["size"]) for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for i, (policy, size) in enumerate(lines):
            mine = sorted(
                (r for r in rows if (r["policy"], r["size"], r["task"]) == (policy, size, task)),
                key=lambda r: r["input_tokens"],
            )
            if not mine:
                continue
            label = policy if len({s for _, s in lines}) == 1 else f"{policy}, {size}"
            ax.plot([r["input_tokens"] for r in mine], [r["retention"] for r in mine], marker="o", color=f"C{i}",
                    label=label)  # fmt: skip
            for r in mine:
                ax.scatter([r["input_tokens"]] * len(r["per_prompt"]), r["per_prompt"], s=8, color=f"C{i}", alpha=0.4)
        ax.axhline(1.0, color="k", lw=0.6)
        budgets = ", ".join(dict.fromkeys(s for _, s in lines))
        ax.set(title=f"{task}: retention at a fixed budget ({budgets})", xlabel="input tokens", ylim=(0, 1.25))
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
