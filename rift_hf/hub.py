"""Publishing a drafter folder on the Hugging Face Hub (`rift-hf push`).

A drafter folder (what `rift-hf train` writes under `<out>/model`) must load and draft wherever plain transformers
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


def check_folder(folder: str | Path) -> list[str]:
    """What a publishable drafter folder lacks (empty when nothing does)."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    missing = []
    if not (folder / "config.json").is_file():
        missing.append("config.json (save the model with save_pretrained)")
    if not any(path.name != HEAD_NAME for path in folder.glob("*.safetensors")):
        missing.append("*.safetensors weights (save_pretrained writes them)")
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.save_pretrained(folder))")
    if not (folder / "README.md").is_file():
        missing.append("README.md, the model card (rift-hf card writes one for a trained drafter)")
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
    if check_load:
        check_plain_load(folder)
    if dry_run:
        return None
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    info = api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="Upload drafter with rift-hf")
    return str(info.commit_url if hasattr(info, "commit_url") else info)
