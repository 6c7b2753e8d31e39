"""Small-batch linear layers on a CPU, computed weight-major (`weight @ x.T`), for the forwards speculation makes.

Speculative decoding runs linear layers on a few rows at a time: the drafter's first forward of a round feeds one or
two tokens, the target verifies gamma + 1. On the CPU we measured (x86_64 AVX2 AMD EPYC, torch 2.13's MKL, fp32)
`torch.nn.functional.linear` on 2-4 rows costs about one full read of the weights *per row*, while the same product
written as `weight @ x.T` reads them about once: with torch's path a 2-token drafter forward took 1.9x a 1-token one
and the target's 12-token verification forward 3.7x its decode step; weight-major made them 1.23x and 1.50x faster
(`python -m benchmarks.linear`, `benchmarks/results/linear-cpu.json`, 2026-12-02); end to end, over 32 and 128 new
tokens, no gain showed that the machine's run-to-run spread could resolve. `weight_major_linear(model)`
switches a model's `nn.Linear` layers to that form for inputs of at most `max_rows` rows on a CPU; other inputs (more
rows, another device, a dtype that differs from the weight's) take torch's own path. The result is the same product
summed in another order: the real pair's logits moved by up to 1e-4 there, with the same argmax. Measure before
relying on it elsewhere: other CPUs and BLAS builds may not share the slow path.
"""

from __future__ import annotations

import torch


class WeightMajorLinear(torch.nn.Linear):
    """`nn.Linear` whose CPU forward on at most `max_rows` rows is `(weight @ x.T).T + bias` (same parameters)."""

    max_rows = 16

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        features = input.shape[-1] if input.dim() else 0
        rows = input.numel() // features if features else 0
        if (
            rows == 0
            or rows > self.max_rows
            or input.device.type != "cpu"
            or self.weight.device.type != "cpu"
            or input.dtype != self.weight.dtype
        ):
            return super().forward(input)
        out = torch.mm(self.weight, input.reshape(rows, features).t()).t()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*input.shape[:-1], self.out_features)


def weight_major_linear(model: torch.nn.Module, enabled: bool = True, max_rows: int = 16) -> int:
    """
    Switch every plain `nn.Linear` of `model` to `WeightMajorLinear` (or back, `enabled=False`); returns how many
    layers changed. Subclasses of `nn.Linear` (quantised or adapter layers) keep their own forward; parameters,
    `state_dict` and `save_pretrained` are unchanged.

    Args:
        max_rows: the largest input (rows = every dimension but the last) computed weight-major; larger inputs (a
            prompt's prefill) take torch's path, which is faster there.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"weight_major_linear takes a torch.nn.Module (a loaded model), not {type(model).__name__}.")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows must be a positive int (rows computed weight-major), got {max_rows!r}.")
    changed = 0
    for module in model.modules():
        if enabled and type(module) in (torch.nn.Linear, WeightMajorLinear):
            changed += type(module) is torch.nn.Linear
            module.__class__ = WeightMajorLinear
            module.max_rows = max_rows
        elif not enabled and type(module) is WeightMajorLinear:
            module.__class__ = torch.nn.Linear
            vars(module).pop("max_rows", None)
            changed += 1
    return changed
