"""The shape of the code: which packages may import which (design.md section 2), no import cycles,
no file past 500 lines but the cohesive ones docs/contributing.md names, and a trainer loop that
reads as its phases. The imports are read with ast, nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "smelt"

# Lower layers never import higher ones; packages within one layer do not import each other. The command
# modules (the `smelt.cli` package, and `python -m smelt`) are the top: they may import anything, and
# nothing imports them.
LAYERS = [
    {"errors"},
    {"jsonl"},  # reading JSON Lines (metric_records reads metrics.jsonl through it)
    {
        "documents",
        "chat_template",
        "layout",
        "executors",
        "progress",
        "metric_records",
        "canaries",
        "numbers",
        "tables",
    },
    {"benchmark_files"},
    {"config", "manifest"},
    {"storage"},  # local paths and URLs of inputs and outputs (data, tokens and the pipeline use it)
    {"model"},
    {"data", "tokenizer"},
    {"tokens"},
    {"checkpoint"},
    {"eval"},
    {"train", "plan"},
    {"report"},
    # The stages of a run directory: their table, the pipeline, lifecycle (staleness, stage locks, moving
    # superseded work aside), the summary and anneal forks. Post-training stages use its locks.
    {"run", "rehearse"},
    {"posttrain", "release"},
    {"cli"},
    {"__main__"},  # `python -m smelt` is the CLI
]
# Arrows against the layers that are still there, each with where it comes from. Remove an entry
# when its import goes; the test fails on a new arrow and on an entry that no longer happens.
KNOWN_ARROWS: dict[tuple[str, str], str] = {}
MAX_LINES = 500
MAX_LOOP_LINES = 60


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str:
    """The package (or top-level module) a module belongs to: smelt.train.trainer -> train."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "smelt"


def _is_module(name: str) -> bool:
    path = SRC.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """The smelt modules a file imports, lazily or not (`from smelt.data import review` is smelt.data.review)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("smelt."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module != "smelt" and not node.module.startswith("smelt."):
                continue
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if _is_module(child) else node.module)
    return {name for name in found if name != "smelt"}


def module_imports() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in SRC.rglob("*.py")}


def package_arrows() -> dict[tuple[str, str], set[str]]:
    """(from package, to package) -> the modules making that import."""
    arrows: dict[tuple[str, str], set[str]] = {}
    for module, imported in module_imports().items():
        for target in imported:
            pair = (_unit(module), _unit(target))
            if pair[0] != pair[1] and pair[1] != "smelt":
                arrows.setdefault(pair, set()).add(module)
    return arrows


def _layer(unit: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if unit in layer), None)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


@pytest.mark.slow
def test_every_package_has_a_layer():
    units = {_unit(m) for m in module_imports()} - {"smelt"}
    missing = sorted(u for u in units if _layer(u) is None)
    assert not missing, f"add {missing} to a layer of LAYERS in tests/test_architecture.py"


@pytest.mark.slow
def test_no_import_against_the_layers():
    wrong = {}
    for (source, target), modules in package_arrows().items():
        low, high = _layer(source), _layer(target)
        if low is None or high is None:
            continue
        if (high > low or (high == low and source != target)) and (source, target) not in KNOWN_ARROWS:
            wrong[(source, target)] = modules
    assert not wrong, "imports against design.md's direction: " + "; ".join(
        f"{s} -> {t} in {', '.join(sorted(m))}" for (s, t), m in sorted(wrong.items())
    )


@pytest.mark.slow
def test_known_arrows_still_happen():
    gone = sorted(set(KNOWN_ARROWS) - set(package_arrows()))
    assert not gone, f"{gone} no longer happen: remove them from KNOWN_ARROWS"


@pytest.mark.slow
def test_no_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for source, target in package_arrows():
        if (source, target) not in KNOWN_ARROWS:
            graph.setdefault(source, set()).add(target)
    cycle = _cycle(graph)
    assert cycle is None, f"import cycle between packages: {' -> '.join(cycle or [])}"


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# Module cycles still there, each with its owner's reason; remove an entry when its cycle goes.
KNOWN_MODULE_CYCLES = {
    frozenset({"smelt.model.moe", "smelt.model.moe_parallel"}): "expert parallelism and the MoE layer",
    frozenset({"smelt.model.generate", "smelt.model.transformer"}): "the KV cache and the model",
}


@pytest.mark.slow
def test_no_cycle_between_modules():
    imports = module_imports()
    graph = {m: {t for t in targets if t in imports and t != m} for m, targets in imports.items()}
    # A package's __init__ that imports its own modules is not a cycle with them.
    graph = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    cycles = {frozenset(c) for c in _cycles(graph)}
    new = [sorted(c) for c in cycles - set(KNOWN_MODULE_CYCLES)]
    assert not new, f"import cycles between modules: {new}"
    gone = [sorted(c) for c in set(KNOWN_MODULE_CYCLES) - cycles]
    assert not gone, f"{gone} are no longer cycles: remove them from KNOWN_MODULE_CYCLES"


def test_no_file_over_500_lines():
    long = {
        p.relative_to(SRC).as_posix(): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"split these files by role (docs/contributing.md, 'File size'): {long}"


def test_the_trainer_loop_reads_as_its_phases():
    tree = ast.parse((SRC / "train" / "trainer.py").read_text(encoding="utf-8"))
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    train = next(n for n in trainer.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    lines = train.end_lineno - train.lineno + 1
    assert lines <= MAX_LOOP_LINES, f"Trainer.train is {lines} lines; move work into a named phase"
    called = {
        n.func.attr for n in ast.walk(train) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }
    phases = {"build", "resume", "step", "apply_or_skip", "log_window", "evaluate", "checkpoint", "finish"}
    assert phases <= called, f"Trainer.train does not call {sorted(phases - called)}"


# Artifact file names and who owns each: everyone else goes through the owner's constant or reader.
OWNED_NAMES = {
    '"smelt.json"': {"layout.py"},  # a trained tokenizer's info (tokenizer/load.read_info reads it)
    '"tokenizer.json"': {"layout.py"},
    '"COMMITTED"': {"layout.py"},  # a committed checkpoint's marker (layout.is_committed)
    '"meta.json"': {"layout.py", "tokens/shards.py"},  # a checkpoint's meta; the token shards' meta
    '"*.bin"': {"tokens/shards.py"},  # token shards (tokens/shards.has_shards)
    '/ "checkpoints"': {"layout.py"},  # RUN/train/checkpoints (layout.checkpoints_dir, CHECKPOINTS)
    '"metrics.jsonl"': {"metric_records.py"},  # a training run's records (metric_records.METRICS)
    "'metrics.jsonl'": {"metric_records.py"},  # the same name in an f-string
}


def test_artifact_names_appear_only_in_their_owners():
    found = {
        (name, p.relative_to(SRC).as_posix())
        for p in SRC.rglob("*.py")
        for name in OWNED_NAMES
        if name in p.read_text(encoding="utf-8")
    }
    strays = sorted((name, path) for name, path in found if path not in OWNED_NAMES[name])
    assert not strays, f"use the owner's constant or reader instead of the literal: {strays}"
