"""Generation integration: the candidate generator, the `cache_implementation="rift"` patches, statistics."""

from .candidate import RiftCandidateGenerator
from .patches import apply, last_stats
from .stats import RiftStats

__all__ = ["RiftCandidateGenerator", "RiftStats", "apply", "last_stats"]
