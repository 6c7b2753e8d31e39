"""Throwaway: page-retrieval variants at 8x on one repeat prompt (not part of the repo)."""
import sys
from pathlib import Path

import torch

from rift_hf.policies import register
from rift_hf.policies.page_retrieval import PageRetrieval
from rift_hf.replay import replay_compare


@register
class GroupMax(PageRetrieval):
    name = "pr-groupmax"

    def retrieve(self, query, low, high, first, scale, recent, selected):
        self._agg = "max"
        return super().retrieve(query, low, high, first, scale, recent, selected)


@register
class MeanKey(PageRetrieval):
    """score = q . (mean key of page): needs the mean; approximate with (min+max)/2 (midrange)."""
    name = "pr-midrange"

    def page_scores(self, query, low, high, scale):
        batch, h_q, length, dim = query.shape
        h_kv = low.shape[1]
        q = query.float().view(batch, h_kv, h_q // h_kv, length, dim)
        return torch.einsum("bhgld,bhnd->bhgln", q, (low.float() + high.float()) / 2) * scale


# group max: patch the aggregation by overriding retrieve logic through a flag
import rift_hf.policies.page_retrieval as prmod

orig = PageRetrieval.retrieve


def retrieve(self, query, low, high, first, scale, recent, selected):
    if not isinstance(self, GroupMax):
        return orig(self, query, low, high, first, scale, recent, selected)
    page, n_sink = self.config.block_size, self.config.n_sink
    batch, h_kv, n_pages = low.shape[:3]
    length = query.shape[2]
    n_pick = selected // page
    device = query.device
    positions = torch.arange(first, first + length, device=device)
    limit = ((positions - recent + 1 - n_sink) // page).clamp(max=n_pages)
    shares = torch.softmax(self._masked(self.page_scores(query, low, high, scale), limit), dim=-1).amax(2)
    pages = shares.topk(n_pick, dim=-1).indices
    offsets = torch.arange(page, device=device)
    rows = (n_sink + pages[..., None] * page + offsets).flatten(-2)
    window = positions[:, None] - torch.arange(recent - 1, -1, -1, device=device)
    sinks = torch.arange(n_sink, device=device).expand(length, -1)
    fixed = torch.cat([sinks, window], dim=-1).expand(batch, h_kv, -1, -1)
    return torch.cat([fixed[..., :n_sink], rows, fixed[..., n_sink:]], dim=-1)


GroupMax.retrieve = retrieve

policies = sys.argv[1].split(",")
tasks = tuple(sys.argv[2].split(",")) if len(sys.argv) > 2 else ("repeat",)
import os
replay_compare("qwen-coder", policies, [int(os.environ.get("C", 8))], 4096, 512, int(os.environ.get("PER", 1)), 11, 64, 128, Path(os.environ.get("OUT", "/tmp/pr/x")), tasks=tasks)
