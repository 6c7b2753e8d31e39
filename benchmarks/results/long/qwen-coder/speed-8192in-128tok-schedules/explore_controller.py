"""Kept beside its output (controller-argparse.txt) as it ran, 2026-12-04: why did the cost-aware length choose 2 on continue:argparse at 8K? Replays the first pass's auto sequence
(repeat:argparse then continue:argparse, the controller carried between calls) and dumps its state per round."""
import json, sys, datetime
from rift_hf.experiments.records import machine
import torch
from rift_hf import last_stats
from rift_hf.cpu import gqa_attention
from rift_hf.generation import candidate
from rift_hf.generation.decode import generate_from
from rift_hf.models import fix_draft_length, load_preset
from rift_hf.prefill import prefill_folder, prefills_root
from rift_hf.prompts import prompt_set
from rift_hf.experiments.records import policy_config
sys.path.insert(0, "/work/main")
from benchmarks.long_inputs import ensure_prompt_cache

target, draft, tok = load_preset("qwen-coder", dtype=torch.float32)
gqa_attention(target); gqa_attention(draft)
fix_draft_length(target, draft, gamma=int(sys.argv[1]) if len(sys.argv) > 1 else 11)
prompts = {p.name: p for p in prompt_set(tok, 8192, 2, sources="code-long")}
config = policy_config("page-round@draft_length=auto", 0.25, 64, 128, None)
print(machine(), datetime.date.today().isoformat(), "fp32, page-round 4x, draft_length=auto, gamma 11")
for name in ("repeat:argparse", "continue:argparse"):
    p = prompts[name]
    cache = ensure_prompt_cache(target, draft, p, prefill_folder(prefills_root(), "qwen-coder", p, target.dtype), 64)
    out, s = generate_from(target, cache, assistant_model=draft, cache_implementation="rift", cache_config=config,
                           max_new_tokens=128, min_new_tokens=128)
    st = last_stats(target)
    print(name, round(s, 1), "AL", round(st.acceptance_length, 2))
    for r in st.rounds:
        print("  ", r["drafted"], r["accepted"], r.get("reason"), round(r["draft_seconds"], 3), round(r["verify_seconds"], 3))
    ctl = candidate._LEARNT[target][draft]
    print("verify sums", {k: (round(a / b, 3), round(b, 2)) for k, (a, b) in sorted(ctl.verify_cost.sums.items())})
    print("line", ctl.verify_cost.line(), "step", ctl.step[0] / max(ctl.step[1], 1e-9), "first", ctl.first[0] / max(ctl.first[1], 1e-9))
    print("acceptance", [round(a, 2) for a in ctl.acceptance()])
    print("rates", [round(ctl.rate(k), 2) for k in range(ctl.max_length + 1)])
