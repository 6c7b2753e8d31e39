"""The page summaries a page policy keeps beside its rows (page-retrieval, page-round), added as pages complete."""

from __future__ import annotations

import torch

from ..storage import Rows


def extend_page_summaries(pages: Rows | None, rows, committed: int, policy, device, headroom: int) -> Rows | None:
    """
    `pages` with the policy's summary (`policy.summarise`) of every whole page among the first `committed` rows of
    `rows` (row = position: a retrieval layer's working set, page-round's store) that it does not hold yet; pages
    start at `n_sink` and span `block_size` rows. Only the new pages' keys are read (dequantised, from a quantised
    store); the summaries live on `device`. Returns the (possibly new) `Rows` of summaries.
    """
    config = policy.config
    page, n_sink = config.block_size, config.n_sink
    whole = max(0, (committed - n_sink) // page)
    done = 0 if pages is None else pages.length
    if whole <= done and pages is not None:
        return pages
    keys: torch.Tensor = rows.key_rows(n_sink + done * page, n_sink + whole * page).to(device)
    summaries = policy.summarise(keys.unflatten(2, (whole - done, page)))
    if pages is None:
        pages = Rows(summaries, whole + headroom, with_values=False)
    pages.append(summaries, None)
    return pages
