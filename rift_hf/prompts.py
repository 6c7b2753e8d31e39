"""Deterministic long prompts from offline text (Python's standard library source).

Two regimes, since compression policies fail in different places:
- `repeat`: reproduce a file given in the prompt (consults text far back: defeats a pure sliding window);
- `continue`: continue a file that the answer already started (leans on what was just written: where prefill
  selection goes stale).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

MODULES = ("argparse", "json.decoder", "textwrap", "difflib", "configparser", "logging", "csv", "tarfile")
TASKS = ("repeat", "continue")


@dataclass(frozen=True)
class Prompt:
    name: str
    task: str
    input_ids: object  # torch.LongTensor [1, T]

    @property
    def tokens(self) -> int:
        return self.input_ids.shape[1]


def _fit(tokenizer, text: str, n_tokens: int) -> str:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:n_tokens]
    return tokenizer.decode(ids)


def build_prompt(tokenizer, module: str, task: str, n_tokens: int) -> Prompt:
    """A chat prompt of about `n_tokens` tokens built from the source of `module`."""
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; choose one of {', '.join(TASKS)}.")
    source = _fit(tokenizer, inspect.getsource(importlib.import_module(module)), n_tokens)
    if task == "repeat":
        request = f"Here is a Python file:\n```python\n{source}\n```\nWrite the same file again, unchanged."
        answer = "```python\n"
    else:
        # The file is the start of the model's own answer, so generation continues it where it stops.
        request = f"Write the Python standard library module `{module}`, complete."
        answer = f"```python\n{source}"
    messages = [{"role": "user", "content": request}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + answer
    else:
        text = request + "\n" + answer
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    return Prompt(name=f"{task}:{module}", task=task, input_ids=ids)


def prompt_set(tokenizer, n_tokens: int, per_task: int, tasks=TASKS) -> list[Prompt]:
    """`per_task` prompts per task, each from a different module, in a fixed order."""
    return [build_prompt(tokenizer, module, task, n_tokens) for task in tasks for module in MODULES[:per_task]]
