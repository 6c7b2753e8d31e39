"""`RiftCache`: a `transformers.Cache` whose full-attention layers keep a fixed budget of past tokens.

Layout (one layer object per model layer, as in `DynamicCache`; the policy picks the full-attention layer's class):

- full attention -> a `RiftLayer` (`layer.py`) of the policy's mode: `RiftSelectLayer` (`select_layer.py`: select
  once, from the prompt), `RiftStoreLayer` (`store_layer.py`: a
  full store, re-selected from) or `RiftRetrievalLayer` (`retrieval_layer.py`: every token kept, each query attends
  rows of its own); the logical length (tokens seen) is kept apart from the stored entries, as
  `DynamicSlidingWindowLayer` does; eviction only at commit points, so a rollback never needs an evicted entry;
- sliding / chunked attention -> transformers' own `DynamicSlidingWindowLayer` (already bounded);
- linear attention / SSM / short conv -> `RiftStateLayer` (`state_layer.py`): snapshots its states after the
  committed tokens of a round and restores them on rollback, so a stateful drafter drafts from the state a fresh
  recompute gives.

Commit points (`rift_cache.py`): in assisted generation (`activate_past_recording()` was called) every `crop` is one,
since what stays after it has been verified by the target; in plain generation every token is committed as soon as
it is written, and the cache settles the previous step when the next forward asks for its mask sizes.
"""

from .layer import ACTIVE_LAYER, RiftLayer
from .retrieval_layer import RiftRetrievalLayer
from .rift_cache import RiftCache
from .select_layer import RiftSelectLayer
from .state_layer import RiftStateLayer
from .store_layer import RiftStoreLayer

__all__ = [
    "ACTIVE_LAYER",
    "RiftCache",
    "RiftLayer",
    "RiftRetrievalLayer",
    "RiftSelectLayer",
    "RiftStateLayer",
    "RiftStoreLayer",
]
