"""The transformers versions rift-hf works with, checked at import (it wraps private `generate` methods), and the
few names that differ between them, each found by looking for the feature rather than at the version number."""

from __future__ import annotations

import dataclasses

# The range the test suite proves (CI runs it on the oldest and the newest); pyproject.toml pins the same.
SUPPORTED = (">=5.23", "<5.26")


def check_transformers(version: str | None = None) -> None:
    """Raise `ImportError` naming the supported range when the installed transformers lies outside it."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if version is None:
        import transformers

        version = transformers.__version__
    if Version(version) not in SpecifierSet(",".join(SUPPORTED)):
        raise ImportError(
            f"rift-hf works with transformers {','.join(SUPPORTED)} (it wraps private generate() methods), but "
            f"transformers {version} is installed; run: pip install 'transformers{','.join(SUPPORTED)}'"
        )


def _cache_field() -> str:
    """What `generate`'s model kwargs, a model's `forward` and its outputs call the cache: `cache` from transformers
    5.24 on, `past_key_values` before (5.24+ still accept the old name from users, with a deprecation warning)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    fields = {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
    return "cache" if "cache" in fields else "past_key_values"


CACHE = _cache_field()


def pop_cache(kwargs: dict):
    """Remove and return the cache a `forward` wrapper was given, under either name (5.24+ models still take
    `past_key_values` from callers, with a deprecation warning)."""
    cache = kwargs.pop(CACHE, None)
    old = kwargs.pop("past_key_values", None)
    return old if cache is None else cache
