"""What a decode-phase run (`generate_from`) times before its first draft: the drafter's recorded prompt forward
loaded into its cache (`load_prefill`: the store filled, quantised where the policy keeps it in int4), and the
policy's first selection, made at the first commit (inside the first drafting round: rift-dyn scores every stored
key with the last window's queries, page-round scores page summaries). A real run pays both inside its prompt
forward; a decode-phase run pays them inside the timed decode, so they are measured here on their own, per policy,
against a DynamicCache (transformers' assisted generation, which has neither).

    python -m benchmarks.setup_cost ~/.cache/rift-hf/prefills/qwen-coder/<prompt folder> --out <file.json>

Median of `--repeats` of each, the settings taking turns in every repeat, after one untimed pass over them; 2
threads. Row keys: `<label>` the load, `<label> first selection` the first commit.
"""

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoConfig, DynamicCache

from lab.cli import split_labels
from lab.records import machine
from rift_hf import RiftConfig
from rift_hf.cache import RiftCache
from rift_hf.models import cache_root
from rift_hf.policies import label_fields
from rift_hf.prefill import PromptCache, load_prefill

SETTINGS = ("transformers", "auto", "page-round", "rift-dyn@tokens_ahead=128,store_dtype=int4")


def _cache(config, label: str):
    if label == "transformers":
        return DynamicCache(config=config)
    return RiftCache(config, RiftConfig.coerce({**label_fields(label), "draft_length": "fixed"}))


def setup_seconds(config, prefill, label: str) -> tuple[float, float]:
    """Seconds of loading `prefill` into a fresh cache of setting `label`, and of the first commit after it (the
    policy's first selection; 0 for a DynamicCache, which selects nothing)."""
    cache = _cache(config, label)
    tick = time.perf_counter()
    load_prefill(cache, prefill)
    load = time.perf_counter() - tick
    if label == "transformers":
        return load, 0.0
    tick = time.perf_counter()
    cache._commit()  # what the first crop of assisted generation runs after its rollback
    first = time.perf_counter() - tick
    if cache.rift_layers and cache.rift_layers[0].selected is None and cache.budget < prefill.tokens:
        raise RuntimeError(f"{label}: the first commit made no selection; nothing was measured.")
    return load, first


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", type=Path, nargs="+", help="prompt-cache folders (benchmarks.long_inputs prefill)")
    parser.add_argument("--drafter", default="qwen2.5-coder-0.5b-instruct", help="a folder under the models root")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    config = AutoConfig.from_pretrained(cache_root() / args.drafter)
    rows = []
    for folder in args.prompts:
        prefill = PromptCache.load(folder).draft
        row = {"prompt": folder.name, "input_tokens": prefill.states[0][0].shape[2]}
        labels = split_labels(args.settings)
        # One untimed pass first: at ~32K the first cache a process fills runs about twice as slowly as the next ones
        # (whichever setting comes first), which is the process warming up, not the setting.
        for label in labels:
            setup_seconds(config, prefill, label)
        # The settings take turns in every repeat, so a drift of the process (allocator, page cache) is shared.
        seconds = {label: [] for label in labels}
        for _ in range(args.repeats):
            for label in labels:
                seconds[label].append(setup_seconds(config, prefill, label))
        for label, pairs in seconds.items():
            row[label] = round(statistics.median(load for load, _ in pairs), 4)
            row[f"{label} first selection"] = round(statistics.median(first for _, first in pairs), 4)
        rows.append(row)
        print(json.dumps(row))
    record = {"rows": rows, "machine": machine(), "threads": 2, "date": datetime.date.today().isoformat()}
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
