"""The capture package's modules import each other without a circle: each
module can be read on its own, in order, from the ones below it."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "capture" / "precompile_capture"


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(source: str, modules: set) -> set:
    """The package's modules `source` imports, anywhere in it (a function's
    import too), except under `if TYPE_CHECKING:`."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level != 1:
            continue
        if _type_checking_only(node, parents):
            continue
        if node.module:
            found.add(node.module.split(".")[0])
        else:
            found.update(alias.name for alias in node.names if alias.name in modules)
    return found & modules


def circles(graph: dict) -> list:
    """Every module that reaches itself, with the path it takes."""
    found = []
    for start in sorted(graph):
        stack = [(start, [start])]
        seen = set()
        while stack:
            module, path = stack.pop()
            for imported in sorted(graph[module]):
                if imported == start:
                    found.append(" -> ".join(path + [start]))
                elif imported not in seen:
                    seen.add(imported)
                    stack.append((imported, path + [imported]))
    return found


def package_graph() -> dict:
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    return {p.stem: imports_of(p.read_text(), modules) - {p.stem} for p in PACKAGE.glob("*.py")}


def test_no_module_of_the_capture_imports_itself_round_a_circle():
    graph = package_graph()
    assert graph["capture"] >= {"compiling", "frames"}  # The graph is read at all.
    assert not circles(graph), "import circles:\n" + "\n".join(circles(graph))


def test_a_circle_through_a_function_level_import_is_found():
    source = "def f():\n    from .cli import resolve\n"
    assert imports_of(source, {"cli"}) == {"cli"}
    assert imports_of("if TYPE_CHECKING:\n    from .cli import x\n", {"cli"}) == set()
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}})
    assert not circles({"a": {"b"}, "b": {"c"}, "c": set()})
