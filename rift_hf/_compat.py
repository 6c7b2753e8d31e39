"""The transformers versions rift-hf works with, checked at import (it wraps private `generate` methods)."""

from __future__ import annotations

# The range the test suite proves; pyproject.toml pins the same.
SUPPORTED = (">=5.23", "<5.24")


def check_transformers(version: str | None = None) -> None:
    """Raise `ImportError` naming the supported range when the installed transformers lies outside it."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if version is None:
        import transformers

        version = transformers.__version__
    if Version(version) not in SpecifierSet(",".join(SUPPORTED)):
        raise ImportError(
            f"rift-hf works with transformers {','.join(SUPPORTED)} (it wraps private generate() methods written "
            f"against 5.23), but transformers {version} is installed; run: "
            f"pip install 'transformers{','.join(SUPPORTED)}'"
        )
