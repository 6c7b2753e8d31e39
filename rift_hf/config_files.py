"""`RiftConfig` as a file: `save_pretrained` / `from_pretrained` (a folder or a Hub repository's `rift_config.json`),
`push_to_hub`, and where a saved `selection_head` may be read from (`confined`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .policies import policy_names
from .policies.base import _label_hint

CONFIG_NAME = "rift_config.json"


class ConfigFiles:
    """The dict, file and Hub side of `RiftConfig` (a mixin for that dataclass)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json_string(self) -> str:
        """The config as JSON (what `save_pretrained` writes), as transformers' configs give theirs."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def to_json_file(self, path) -> None:
        """Write `to_json_string()` to `path` (`save_pretrained(folder)` writes `<folder>/rift_config.json`)."""
        Path(path).write_text(self.to_json_string())

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"Unknown RiftConfig field(s) {unknown}; valid fields: {sorted(names)}.")
        return cls(**data)

    @classmethod
    def preset(cls, name: str, **overrides: Any):
        """
        A named preset: one per policy of the spec table, with the spec's defaults.

        >>> from rift_hf import RiftConfig
        >>> RiftConfig.preset("rift-dyn", budget=2048).delta
        128
        """
        if name not in policy_names():
            raise ValueError(f"Unknown preset {name!r}; choose one of {', '.join(policy_names())}.{_label_hint(name)}")
        return cls(policy=name, **overrides)

    @classmethod
    def coerce(cls, value, folder=None):
        """Accept a `RiftConfig`, a dict of its fields, a preset name, or `None` (the default preset). With `folder`
        (the model folder a dict came with, e.g. in its `generation_config.json`), a `selection_head` the dict names
        is read from inside that folder only, as `from_pretrained` reads one (`confined`)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls.preset(value)
        if isinstance(value, dict):
            data = dict(value)
            head = data.get("selection_head")
            if folder is not None and isinstance(head, str) and head:
                data["selection_head"] = str(confined(folder, head, "cache_config"))
            return cls.from_dict(data)
        raise TypeError(f"`cache_config` must be a RiftConfig, a dict or a preset name, got {type(value).__name__}.")

    def save_pretrained(self, folder, push_to_hub: bool = False, **hub_kwargs) -> Path:
        """Write this config to `<folder>/rift_config.json`, a file plain transformers ignores (a drafter's folder
        stays loadable everywhere; rift reads it with `RiftConfig.from_pretrained`). A `selection_head` given by an
        absolute path is written relative to the folder (copied into it when it lies elsewhere). With
        `push_to_hub=True` the folder's config (and head) is then uploaded: `hub_kwargs` go to `push_to_hub`
        (`repo_id` defaults to the folder's name)."""
        path = Path(folder) / CONFIG_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_dict()
        head = data.get("selection_head")
        if head and Path(head).is_absolute():
            # Named relative to the folder, inside it (`from_pretrained` reads nothing outside): a head elsewhere is
            # copied in. A relative path already means "in the folder".
            source = Path(head) / "selection_head.safetensors" if Path(head).is_dir() else Path(head)
            try:
                data["selection_head"] = str(source.resolve().relative_to(Path(folder).resolve()))
            except ValueError:
                import shutil

                shutil.copyfile(source, Path(folder) / "selection_head.safetensors")
                data["selection_head"] = "selection_head.safetensors"
        path.write_text(json.dumps(data, indent=2) + "\n")
        if push_to_hub:
            hub_kwargs.setdefault("repo_id", Path(folder).resolve().name)
            type(self).from_pretrained(folder).push_to_hub(**hub_kwargs)
        return path

    def push_to_hub(
        self,
        repo_id: str,
        *,
        token: str | bool | None = None,
        revision: str | None = None,
        private: bool | None = None,
        commit_message: str = "Upload rift_config.json",
        create_pr: bool = False,
    ):
        """Upload this config (and its selection head) to the Hub repository `repo_id`, created if missing: the
        drafter repository it belongs beside, or a small one of its own. Returns the commit's info."""
        import tempfile

        from huggingface_hub import HfApi

        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder)
            return api.upload_folder(
                repo_id=repo_id,
                folder_path=folder,
                revision=revision,
                commit_message=commit_message,
                create_pr=create_pr,
            )

    @classmethod
    def from_pretrained(
        cls,
        folder,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | None = None,
        local_files_only: bool = False,
        **overrides,
    ):
        """The config a folder or a Hub repository id carries in `rift_config.json` (see `save_pretrained`), with
        `overrides` (`RiftConfig` fields) replacing what it holds, as transformers' configs take them;
        `revision`, `token`, `cache_dir` and `local_files_only` as in `transformers`' `from_pretrained`."""
        local = Path(folder).is_dir()

        def fetch(name: str) -> Path:
            from huggingface_hub import hf_hub_download
            from huggingface_hub.errors import (
                EntryNotFoundError,
                HFValidationError,
                LocalEntryNotFoundError,
                RepositoryNotFoundError,
            )

            try:
                return Path(
                    hf_hub_download(
                        str(folder),
                        name,
                        revision=revision,
                        token=token,
                        cache_dir=cache_dir,
                        local_files_only=local_files_only,
                    )
                )
            except HFValidationError:
                raise FileNotFoundError(
                    f"No folder {folder!s}, and it is not a Hub repository id (namespace/name); give the path of "
                    "a folder written by RiftConfig.save_pretrained, or a repository id."
                ) from None
            except LocalEntryNotFoundError:  # offline (or local_files_only) and not in the Hub cache
                raise FileNotFoundError(
                    f"No folder {folder!s} here, and no cached copy of a Hub repository of that name (the Hub was not "
                    "reached: offline or local_files_only=True); check the path, or connect once to download it."
                ) from None
            except RepositoryNotFoundError:
                raise FileNotFoundError(
                    f"No folder {folder!s} here, and no Hub repository of that name (or it is private: pass token=)."
                ) from None
            except EntryNotFoundError:
                raise FileNotFoundError(
                    f"The Hub repository {folder!s}{'@' + revision if revision else ''} has no {name}; save one "
                    "with RiftConfig(...).save_pretrained(folder, push_to_hub=True)."
                ) from None

        path = Path(folder) / CONFIG_NAME if local else fetch(CONFIG_NAME)
        if not path.is_file():
            raise FileNotFoundError(
                f"{folder} has no {CONFIG_NAME}; pass a RiftConfig or a dict as cache_config, or save one with "
                "RiftConfig(...).save_pretrained(folder)."
            )
        data = json.loads(path.read_text())
        head = data.get("selection_head")
        if isinstance(head, str) and head:  # saved relative to the folder, and read from inside it only
            data["selection_head"] = str(confined(folder, head, path) if local else fetch(_relative(head, path)))
        return cls.from_dict({**data, **overrides})


def _relative(head: str, source) -> str:
    """`head` if it is a path relative to the folder it came with and stays inside it, else a ValueError."""
    if Path(head).is_absolute() or ".." in Path(head).parts:
        raise ValueError(
            f"{source} names selection_head {head!r}, outside the folder it came with; a config read from a file or "
            "a dict may only name a head inside the model's own folder (or Hub repository), by a relative path. To "
            "use a head elsewhere, pass cache_config=RiftConfig(selection_head=...) made in your own code."
        )
    return head


def confined(folder, head: str, source) -> Path:
    """The file `head` names inside `folder`, refused (ValueError) if the name or a symlink on the way leads outside
    it; a Hugging Face cache snapshot's symlinks into its repository's `blobs/` are the one exception."""
    root = Path(folder).resolve()
    path = (root / _relative(head, source)).resolve()
    allowed = [root]
    if root.parent.name == "snapshots":  # huggingface_hub's cache: snapshots/<rev>/<file> -> ../../blobs/<hash>
        allowed.append(root.parent.parent / "blobs")
    if not any(path == base or base in path.parents for base in allowed):
        raise ValueError(
            f"{source} names selection_head {head!r}, which resolves (through a symlink) to {path}, outside "
            f"{root}; a config may only name a head inside the model's own folder."
        )
    return path
