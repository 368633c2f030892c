"""Which of Halfcast's packages may import which, read from the code with ``ast``; and the picture that shows it.

Every ``import``/``from ... import`` of a first-party package, at any depth of a module
(imports inside functions included), is checked against :data:`ALLOWED`, with the few
exceptions of :data:`EXCEPTIONS`, each with its reason (docs/architecture.md, "Package
rules"). The picture at the top of docs/architecture.md draws one dotted arrow per pair
of packages of which the first imports the second: exactly the pairs the code has.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: The folders of Halfcast's code: those that ship (pyproject.toml), the migrations, and the benchmarks.
FOLDERS = ("halfcast", "server", "worker", "trainer", "migrations", "bench")
#: The packages the rules are about, each a dotted prefix: a module belongs to the longest that it starts with.
#: ``halfcast`` itself is the client (the client, its errors and events, its files, the CLI).
PACKAGES = (
    "halfcast.common",
    "halfcast.contracts",
    "halfcast.core",
    "halfcast",
    "server",
    "worker",
    "trainer",
    "migrations",
    "bench",
)
#: Each package's node in the picture (Mermaid ids have no dots).
NODES = {"halfcast.common": "common", "halfcast.contracts": "contracts", "halfcast.core": "core", "halfcast": "client"}
#: The modules of other packages each package may import (a module allows its submodules too).
ALLOWED: dict[str, tuple[str, ...]] = {
    # general helpers (redaction, log quieting, time, strict JSON): the standard library only
    "halfcast.common": (),
    # what flows between the others, defined once (pydantic only): imports none of them
    "halfcast.contracts": (),
    # pure PyTorch: nothing of the rest but the contracts and the helpers
    "trainer": ("halfcast.contracts", "halfcast.common"),
    # the client and the CLI's job commands: the data directory's token file, and the settings' type only
    "halfcast": ("halfcast.core.data_dir", "halfcast.core.settings", "halfcast.contracts", "halfcast.common"),
    # the shared core (settings, database, data directory, Celery app): the trainer's registry file names
    "halfcast.core": ("trainer.registered", "halfcast.contracts", "halfcast.common"),
    # the shared core, and the trainer's torch-free contract (the record file, the start-up phases, the registry)
    "worker": (
        "halfcast.core",
        "trainer.records",
        "trainer.startup",
        "trainer.registered",
        "halfcast.contracts",
        "halfcast.common",
    ),
    # the shared core; the client's export files and token file; the trainer's torch-free input rules (row
    # parser, model-directory safety, supported model types, registry layout), so an upload the API accepts
    # is one the trainer reads
    "server": (
        "halfcast.core",
        "halfcast.files",
        "halfcast.cli.credentials",
        "trainer.errors",
        "trainer.data.jsonl.formats",
        "trainer.data.jsonl.rows",
        "trainer.hf.safety",
        "trainer.hf.model_types",
        "trainer.registered",
        "halfcast.contracts",
        "halfcast.common",
    ),
    "migrations": ("halfcast.core.db", "halfcast.core.settings", "halfcast.contracts", "halfcast.common"),
    # measures the others (not shipped)
    "bench": ("halfcast", "server", "worker", "trainer"),
}
#: The imports outside :data:`ALLOWED`: (importing module, imported module) -> why.
EXCEPTIONS: dict[tuple[str, str], str] = {
    (
        "worker.launch.torchrun",
        "trainer.preemption",
    ): "torchrun's own process (it imports torch), never the Celery worker",
    (
        "worker.warm.standby",
        "trainer.__main__",
    ): "the warm standby is the ranks' Python (it imports torch), never the Celery worker",
    (
        "worker.warm.standby",
        "trainer.preemption",
    ): "the warm standby ends as a rank does, without the interpreter's teardown",
}
#: A dotted arrow of the Mermaid picture: ``a -.-> b`` or ``a -.->|label| b``.
IMPORT_ARROW = re.compile(r"^\s*(\w+)\s*-\.->(?:\|[^|]*\|)?\s*(\w+)\s*$")


def module_name(path: Path) -> str:
    """The dotted module name of a file under :data:`ROOT` (a package's ``__init__.py`` names the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str | None:
    """The package of :data:`PACKAGES` that ``module`` belongs to (the longest prefix), ``None`` for a third party's."""
    for package in PACKAGES:  # longest first where one is inside another
        if module == package or module.startswith(package + "."):
            return package
    return None


def first_party_imports() -> Iterator[tuple[str, str]]:
    """(importing module, imported module) for every import of one package's module by another package."""
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            importer = module_name(path)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    if package_of(name) not in (None, package_of(importer)):
                        yield importer, name


def allows(allowed: tuple[str, ...], name: str) -> bool:
    """Whether ``name`` is one of the ``allowed`` modules or inside one of them."""
    return any(name == module or name.startswith(module + ".") for module in allowed)


def test_each_package_imports_only_what_its_rules_allow() -> None:
    breaking = [
        (importer, name)
        for importer, name in first_party_imports()
        if not allows(ALLOWED[package_of(importer) or ""], name)
    ]
    assert [pair for pair in breaking if pair not in EXCEPTIONS] == []


def test_every_exception_is_still_in_the_code() -> None:
    assert set(EXCEPTIONS) <= set(first_party_imports())


def test_the_architecture_doc_names_every_exception() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert [pair for pair in EXCEPTIONS if not all(f"`{module}`" in text for module in pair)] == []


def picture() -> list[str]:
    """The lines of the Mermaid block that opens docs/architecture.md."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start = text.index("```mermaid\n") + len("```mermaid\n")
    return text[start : text.index("```", start)].splitlines()


def node(module: str) -> str:
    """The picture's node of ``module``'s package."""
    package = package_of(module) or module
    return NODES.get(package, package)


def test_the_picture_draws_exactly_the_imports_between_packages() -> None:
    drawn = {(m.group(1), m.group(2)) for line in picture() if (m := IMPORT_ARROW.match(line))}
    in_code = {(node(importer), node(name)) for importer, name in first_party_imports()}
    assert drawn == in_code


def test_the_picture_numbers_the_path_of_a_job_once_each() -> None:
    labels = [m.group(1) for line in picture() if (m := re.search(r'==>\|"([^"]*)"\|', line))]
    steps = sorted(int(number) for label in labels for number in re.findall(r"(?:^|<br/>)(\d+)\. ", label))
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 10


def module_imports() -> dict[str, set[str]]:
    """Each first-party module's first-party imports (inside functions too), as module names.

    ``from a.b import c`` counts as importing ``a.b.c`` where that is a module, else ``a.b``.
    """
    files = {module_name(path): path for folder in FOLDERS for path in (ROOT / folder).rglob("*.py")}

    def module_of(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for importer, path in files.items():
        names: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names += [f"{node.module}.{alias.name}" for alias in node.names]
        graph[importer] = {found for name in names if (found := module_of(name)) not in (None, importer)}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph``: each set of two or more modules that import one another, however far round."""
    reach = {module: set(imports) for module, imports in graph.items()}
    changed = True
    while changed:  # transitive closure (a few hundred modules: quick enough)
        changed = False
        for reached in reach.values():
            more = set().union(*(reach.get(other, set()) for other in reached)) - reached
            if more:
                reached |= more
                changed = True
    circles = {frozenset(m for m in reach[module] if module in reach.get(m, set())) | {module} for module in reach}
    return sorted(sorted(circle) for circle in circles if len(circle) > 1)


def test_no_modules_import_one_another_in_a_circle() -> None:
    """E.g. ``trainer.components`` → ``trainer.models`` → ``trainer.hf.build`` → ``trainer.components`` (issue 30)."""
    assert import_circles(module_imports()) == []


def test_a_circle_is_found_however_far_round() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]


def test_no_packages_import_one_another_in_a_circle() -> None:
    """E.g. ``server`` ⇄ ``worker`` before the shared core moved out of server/ (issue 30 item 2)."""
    graph: dict[str, set[str]] = {}
    for importer, name in first_party_imports():
        graph.setdefault(node(importer), set()).add(node(name))
    assert import_circles(graph) == []


#: worker/'s parts by layer, lowest first (docs/worker.md): a part imports its own modules and lower layers' only.
#: A part is a folder (``launch``) or a top-level module (``runner``).
WORKER_LAYERS: tuple[tuple[str, ...], ...] = (
    ("resources", "messages", "launch", "store", "roster"),
    ("warm", "records"),
    ("lifecycle",),
    ("runner",),
    ("gang",),
    ("tasks",),
    ("__main__",),
    ("cli",),
)


def layer_breaks(graph: dict[str, set[str]], package: str, layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """``importer -> imported`` for each import inside ``package`` of a part in the same or a higher layer."""
    layer = {part: n for n, parts in enumerate(layers) for part in parts}

    def part(module: str) -> str | None:
        rest = module.removeprefix(package + ".")
        return None if rest == module else rest.split(".")[0]

    breaks = []
    for importer, imported in sorted(graph.items()):
        for name in sorted(imported):
            low, high = part(importer), part(name)
            if low is None or high is None or low == high:
                continue
            if layer.get(high, len(layers)) >= layer.get(low, -1):
                breaks.append(f"{importer} -> {name}")
    return breaks


def test_the_worker_imports_down_its_layers_only() -> None:
    graph = {module: imports for module, imports in module_imports().items() if module.startswith("worker.")}
    parts = {module.split(".")[1] for module in graph}
    assert parts == {part for parts_ in WORKER_LAYERS for part in parts_}, "place every worker part in a layer"
    assert layer_breaks(graph, "worker", WORKER_LAYERS) == []


def test_an_import_up_or_across_a_layer_is_found() -> None:
    graph = {"w.a.x": {"w.b.y", "w.a.z"}, "w.b.y": {"w.c"}, "w.c": {"w.a.x"}}
    layers = (("a",), ("b", "c"))
    assert layer_breaks(graph, "w", layers) == ["w.a.x -> w.b.y", "w.b.y -> w.c"]
