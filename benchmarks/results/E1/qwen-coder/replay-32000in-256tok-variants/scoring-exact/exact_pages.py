"""Scratch: is page-round's ~32K repeat loss its page summaries (midrange) or its single query?
page-round-exact: pages ranked by their exact attention share (every stored key, dequantised) for the newest query;
otherwise page-round (pages_ahead, sinks, window, budget). page-round-mean: page-round with mean-key summaries.
Run (2026-12-04) as `python exact_pages.py replay --preset qwen-coder --input-tokens 32000 --new-tokens 256 --per-task 2
--tasks repeat --sources repo:email/message.py,repo:http/client.py --policies full,page-round,page-round-exact,
page-round-mean,page-round@block_size=4,pages_ahead=4,rift-dyn@tokens_ahead=128,store_dtype=int4 --dtype bfloat16
--target-dtype bfloat16 --cached-only --prefills ~/.cache/rift-hf/prefills --out <dir> --summary <scratch>
--compressions 4`; a scratch study, not part of the package."""

import sys

import torch

import rift_hf  # noqa
from rift_hf.policies.base import register
from rift_hf.policies.page_round import PageRound
from rift_hf.policies.selection import rank_pages_ahead


def page_shares(query, keys, scale, page, n_sink, newest):
    b, hq, _, d = query.shape
    hkv, t = keys.shape[1], keys.shape[2]
    q = query[:, :, -newest:].float().reshape(b, hkv, -1, d)
    s = torch.softmax(torch.matmul(q, keys.float().transpose(-1, -2)) * scale, dim=-1).mean(2)[0]  # [H_kv, T]
    n = (t - n_sink) // page
    return s[:, n_sink : n_sink + n * page].reshape(hkv, n, page).sum(-1)  # [H_kv, n]


@register
class PageRoundExact(PageRound):
    name = "page-round-exact"
    summarises_pages = False

    def select_layers(self, layers, cache):
        return None

    def score(self, query, keys, scale, sinks):
        return (query, keys, scale)

    def select(self, scores, lo, hi, count):
        query, keys, scale = scores
        page, n_sink = self.config.block_size, self.config.n_sink
        pages = page_shares(query, keys, scale, page, n_sink, self.config.score_queries)
        last = min(pages.shape[1], (hi - n_sink) // page)
        pages = pages[:, :last]
        n_pick = min(count // page, last)
        chosen = rank_pages_ahead(pages, self.config.pages_ahead)[:, :n_pick].sort(dim=-1).values
        offsets = torch.arange(page, device=keys.device)
        return (n_sink + chosen[:, :, None] * page + offsets).flatten(1)


@register
class PageRoundMean(PageRound):
    name = "page-round-mean"
    summarise = staticmethod(lambda keys: keys.mean(3))


rift_hf.POLICIES = (*rift_hf.POLICIES, "page-round-exact", "page-round-mean")

if __name__ == "__main__":
    from lab.cli import main

    main(sys.argv[1:])
