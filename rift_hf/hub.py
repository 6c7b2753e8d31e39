"""Publishing a drafter folder on the Hugging Face Hub (`rift-hf push`).

A drafter folder (what `python -m lab train` writes under `<out>/model`) must load and draft wherever plain transformers
loads a model: weights, config, tokenizer, a model card, and the recommended `RiftConfig` in `rift_config.json`,
which transformers ignores. `check_folder` lists what is missing, `check_plain_load` loads the folder in a fresh
interpreter that never imports rift_hf and drafts with it, and `push` uploads with `huggingface_hub` (or stops after
the checks with `dry_run=True`, which is what runs offline).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from .config import CONFIG_NAME
from .policies.selection_head import HEAD_NAME

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def head_only(folder: str | Path) -> bool:
    """A selection head's own repository: the head and the `rift_config.json` naming it, no model (the drafter is the
    base model, loaded from its own repository)."""
    folder = Path(folder)
    return (folder / HEAD_NAME).is_file() and not (folder / "config.json").is_file()


def check_folder(folder: str | Path) -> list[str]:
    """What a publishable drafter folder (or a selection head's own folder) lacks (empty when nothing does)."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    missing = []
    if head_only(folder):
        if not (folder / "README.md").is_file():
            missing.append("README.md, the card (python -m lab card writes one for a trained head)")
        config = folder / CONFIG_NAME
        head = json.loads(config.read_text()).get("selection_head") if config.is_file() else None
        if head != HEAD_NAME:
            missing.append(f"{CONFIG_NAME} naming {HEAD_NAME} (RiftConfig(..., selection_head=...).save_pretrained)")
        return missing
    if not (folder / "config.json").is_file():
        missing.append("config.json (save the model with save_pretrained)")
    if not any(path.name != HEAD_NAME for path in folder.glob("*.safetensors")):
        missing.append("*.safetensors weights (save_pretrained writes them)")
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.save_pretrained(folder))")
    if not (folder / "README.md").is_file():
        missing.append("README.md, the model card (python -m lab card writes one for a trained drafter)")
    if not (folder / CONFIG_NAME).is_file():
        missing.append(f"{CONFIG_NAME}, the recommended RiftConfig (RiftConfig(...).save_pretrained(folder))")
    else:
        head = json.loads((folder / CONFIG_NAME).read_text()).get("selection_head")
        if head and (Path(head).is_absolute() or not (folder / head).is_file()):
            missing.append(
                f"{head}, the selection head {CONFIG_NAME} names (a file inside the folder, named relative to it)"
            )
    return missing


def check_plain_load(folder: str | Path, timeout: float = 600) -> None:
    """Load `folder` with plain transformers in a fresh interpreter (rift_hf never imported) and draft with it as its
    own assistant for a few tokens; raise `RuntimeError` with the child's error if anything fails."""
    script = textwrap.dedent(
        f"""
        import sys
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        folder = {str(Path(folder))!r}
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder)
        GenerationConfig.from_pretrained(folder)
        ids = tokenizer("def main():", return_tensors="pt").input_ids
        plain = model.generate(ids, max_new_tokens=4, do_sample=False)
        out = model.generate(ids, assistant_model=model, max_new_tokens=4, do_sample=False)
        assert torch.equal(out, plain), "drafting changed the output"
        assert "rift_hf" not in sys.modules, "rift_hf was imported"
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not done.stdout.strip().endswith("ok"):
        raise RuntimeError(f"{folder} does not load and draft in plain transformers:\n{done.stderr[-2000:]}")


def push(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    dry_run: bool = False,
    token: str | None = None,
    check_load: bool = True,
) -> str | None:
    """
    Check `folder` and upload it to the Hub model repository `repo_id` (created if absent).

    Returns the commit URL, or `None` with `dry_run=True` (checks only, nothing leaves the machine). Raises
    `ValueError` naming what the folder lacks, `RuntimeError` when it does not load in plain transformers.
    """
    missing = check_folder(folder)
    if missing:
        raise ValueError(f"{folder} is not ready to publish; missing: " + "; ".join(missing))
    if check_load and not head_only(folder):  # a head's folder holds no model to load
        check_plain_load(folder)
    if dry_run:
        return None
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="Upload drafter with rift-hf")
    return str(info.commit_url if hasattr(info, "commit_url") else info)


# custom_generate/generate.py, formatted with the repository (or folder) that holds the package's copy.
CUSTOM_GENERATE = '''"""rift-hf as a Hub-hosted generation method (written by `rift-hf push --custom-generate`).

    target.generate(ids, assistant_model=drafter, custom_generate="{source}", trust_remote_code=True,
                    max_new_tokens=256, cache_config={{"policy": "page-round", "budget": 0.25}})

runs assisted generation with the drafter's KV cache compressed by RIFT (cache_implementation="rift"): with an
installed rift_hf when there is one, otherwise with the copy of the package kept beside this file.
"""

import importlib
import importlib.util
import os
import sys

SOURCE = {source!r}  # the repository (or local folder) that holds custom_generate/rift_hf


def _rift_hf():
    if "rift_hf" not in sys.modules and importlib.util.find_spec("rift_hf") is None:
        folder = SOURCE
        if not os.path.isdir(folder):
            from huggingface_hub import snapshot_download

            folder = snapshot_download(SOURCE, allow_patterns=["custom_generate/rift_hf/**"])
        sys.path.insert(0, os.path.join(folder, "custom_generate"))
    return importlib.import_module("rift_hf")


def generate(model, *args, **kwargs):
    """`model.generate` with `cache_implementation="rift"`; the drafter comes as `assistant_model`."""
    _rift_hf()  # registers the "rift" cache implementation and attention backend with transformers
    if kwargs.get("assistant_model") is None:
        raise ValueError("rift compresses the drafter's cache: pass the drafter as assistant_model=...")
    kwargs["cache_implementation"] = "rift"
    return model.generate(*args, **kwargs)
'''


def copy_package(dest: Path, demo: bool = False) -> Path:
    """Copy the installed rift_hf package to `dest` (kernels included; the demo only with `demo`), for folders that
    must run without the package installed (a Space, a `custom_generate` repository)."""
    import shutil

    import rift_hf

    skip = ("__pycache__", "*.pyc", "screenshot.png", *(() if demo else ("demo",)))
    ignore = shutil.ignore_patterns(*skip)
    shutil.copytree(Path(rift_hf.__file__).parent, dest, ignore=ignore)
    if demo and not (dest / "demo").exists():  # an editable install maps demo/ from the repo's top level
        import rift_hf.demo

        shutil.copytree(Path(rift_hf.demo.__file__).parent, dest / "demo", ignore=ignore)
    return dest


def write_custom_generate(folder: str | Path, source: str | None = None) -> Path:
    """
    Add `custom_generate/` to `folder`: transformers' Hub-hosted generation method (`generate(custom_generate=<repo>,
    trust_remote_code=True)`) with a copy of the rift_hf package beside it, so that a user can try rift without
    installing it. `source` is the repository id the folder will be pushed to (default: the folder itself, for a
    local try). Returns the `custom_generate` folder.
    """
    import shutil

    folder = Path(folder)
    out = folder / "custom_generate"
    if out.exists():
        shutil.rmtree(out)
    copy_package(out / "rift_hf")
    source = source or str(folder.resolve())
    (out / "generate.py").write_text(CUSTOM_GENERATE.format(source=source))
    # transformers checks these before running generate.py: what rift_hf needs at import, nothing more (its checker
    # reads one specifier per line; `import rift_hf` refuses a transformers above the supported range itself)
    (out / "requirements.txt").write_text("transformers>=5.23\nsafetensors\nhuggingface_hub\n")
    return out
