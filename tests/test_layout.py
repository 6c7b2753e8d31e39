"""The library and the lab apart: nothing a user imports (config, policies, storage, cache, attention, kernels,
generation, replay, prefill, training) imports the command line, the demo, the real-model presets or the prompt sets,
and nothing in `rift_hf` imports the lab (`lab/`: runners, recipes, tables, plots, beside the package, not in it);
the layout is read from the sources, so a new import that breaks it fails here."""

import ast
from pathlib import Path

import rift_hf
import rift_hf.cli

PACKAGE = Path(rift_hf.__file__).parent
# The faces: what runs and records experiments, and what a user drives from outside Python.
LAB = ("rift_hf.cli", "lab", "rift_hf.demo", "rift_hf.models", "rift_hf.prompts", "rift_hf.hub")
LAB_PACKAGE = PACKAGE.parent / "lab"


def _module(path: Path) -> tuple[str, list[str]]:
    parts = ["rift_hf", *path.relative_to(PACKAGE).with_suffix("").parts]
    package = parts[:-1]
    if parts[-1] == "__init__":
        parts = package = parts[:-1]
    return ".".join(parts), package


def _imports(path: Path) -> set[str]:
    _, package = _module(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)  # `from . import cli`
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _in(name: str, packages) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_library_never_imports_the_lab():
    library = [p for p in PACKAGE.rglob("*.py") if not _in(_module(p)[0], LAB)]
    assert len(library) > 20  # the walk found the package (and its kernels)
    crossings = {f"{_module(path)[0]} imports {name}" for path in library for name in _imports(path) if _in(name, LAB)}
    assert not crossings, sorted(crossings)


def test_no_module_of_the_package_imports_the_lab():
    """The installed package (faces included: its CLI, demo, hub) runs without the lab, which is not in the wheel."""
    crossings = {f"{_module(p)[0]} imports {n}" for p in PACKAGE.rglob("*.py") for n in _imports(p) if _in(n, ["lab"])}
    assert not crossings, sorted(crossings)
    assert not (PACKAGE / "experiments").exists()


def test_the_lab_commands_are_where_its_cli_finds_them():
    from lab import cli

    imported = set().union(*(_lab_imports(path) for path in (LAB_PACKAGE / "cli").glob("*.py")))
    assert {"lab.compare", "lab.tables", "lab.replay_runs"} <= imported
    assert set(rift_hf.cli.LAB_COMMANDS) <= set(cli.COMMANDS) and set(rift_hf.cli.COMMANDS) <= set(cli.COMMANDS)
    assert not set(rift_hf.cli.LAB_COMMANDS) & set(rift_hf.cli.COMMANDS)


def _lab_imports(path: Path) -> set[str]:
    """Absolute names a lab module imports (its relative imports resolved inside `lab`)."""
    package = ["lab", *path.relative_to(LAB_PACKAGE).parent.parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            found.add(".".join(base + ([node.module] if node.module else [])))
    return found


def test_the_command_line_is_one_small_module_per_subcommand():
    """Each subcommand's arguments and its run side by side, no function long enough to hide a second job."""
    from lab import cli as lab_cli
    from rift_hf import cli

    for name, command in lab_cli.COMMANDS.items():
        home = "rift_hf.cli" if name in cli.COMMANDS else "lab.cli"
        assert command.__name__ == f"{home}.{name.replace('-', '_')}"
        assert callable(command.add_arguments) and callable(command.run) and command.HELP
    for path in [*(PACKAGE / "cli").glob("*.py"), *(LAB_PACKAGE / "cli").glob("*.py")]:
        source = path.read_text()
        assert len(source.splitlines()) < 400, path.name
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef):
                assert node.end_lineno - node.lineno < 60, f"{path.name}: {node.name}"
    assert not (PACKAGE.parent / "kernels" / "__init__.py").exists()  # would shadow Hugging Face's `kernels`


def test_every_import_of_the_package_names_a_module_that_exists():
    """Imports inside functions run only when their branch does; a moved module must not leave one dangling."""
    import importlib.util

    missing = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("rift_hf")):
                _, package = _module(path)
                base = package[: len(package) - (node.level - 1)] if node.level else []
                name = ".".join(base + ([node.module] if node.module else []))
                if importlib.util.find_spec(name) is None:
                    missing.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    assert not missing, missing


def test_the_cache_is_one_small_class_per_mode():
    """transformers' cache layers are small classes, one per kind; so are ours (a mode's logic in its own file, the
    shared helpers beside them), none long enough to hide a second mode behind a flag."""
    from rift_hf.cache import RiftLayer, RiftRetrievalLayer, RiftSelectLayer, RiftStoreLayer

    classes = {}
    for path in (PACKAGE / "cache").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = node.end_lineno - node.lineno + 1
    assert {"RiftCache", "RiftLayer", "RiftSelectLayer", "RiftStoreLayer", "RiftRetrievalLayer"} <= set(classes)
    assert max(classes.values()) <= 200, classes
    for mode in (RiftSelectLayer, RiftStoreLayer, RiftRetrievalLayer):
        assert mode.__bases__ == (RiftLayer,)  # each mode on the shared layer, none on another mode


def test_the_package_has_no_import_circle():
    """No module of `rift_hf` reaches itself through its imports: TYPE_CHECKING and function-level ones count too (a
    `from .x import y` names module `x`, or package `x`'s `__init__`)."""
    modules = {_module(p)[0]: p for p in PACKAGE.rglob("*.py")}
    assert "rift_hf.cache.rift_cache" in modules

    def target(name: str) -> str | None:  # the longest prefix of an imported name that is a module of the package
        parts = name.split(".")
        return next((".".join(parts[:k]) for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in modules), None)

    graph = {m: {target(n) for n in _imports(p)} - {None, m} for m, p in modules.items()}
    circles = []
    for start in graph:  # a depth-first walk from each module back to itself
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.append(" -> ".join([*path, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert not circles, circles[:5]
