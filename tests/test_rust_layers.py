"""The router crate's files import each other one way only: no file of `rust_router/src`
reaches itself through `use` paths (an import circle), so each layer can be read, tested and
replaced knowing only the layers under it.

The graph is read from the source text: every `crate::…`, `super::…` and `self::…` path outside
comments and `#[cfg(test)]` items, resolved to the file that defines the module it names (a
name re-exported with `pub use` is followed to where it is defined). Test files are left out:
they sit beside the code they test and may reach anything.

    python tests/test_rust_layers.py    # prints each file's imports, then any circle
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "rust_router" / "src"

PATH = re.compile(r"\b(?:crate|super|self)(?:::\w+)+")
VISIBILITY = re.compile(r"pub\(in [\w:]+\)")  # `pub(in crate::x)` names a module, imports none
TEST_ONLY = re.compile(r"\s*#\[cfg\((?:all\()?test\b")
CHILD = re.compile(r"(?<![:\w])(\w+)::\w")
USE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.DOTALL)


def is_test_file(path: Path) -> bool:
    return path.stem.startswith("tests") or path.stem.endswith("_tests") or path.stem == "test_util"


def module_of(path: Path) -> tuple[str, ...]:
    """`http/error.rs` -> ("http", "error"); `http/mod.rs` -> ("http",); `lib.rs` -> ()."""
    parts = path.relative_to(SRC).with_suffix("").parts
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def without_tests_and_comments(text: str) -> str:
    """The source without `//` comments and without items marked `#[cfg(test)]`."""
    lines = [re.sub(r"^\s*//.*", "", line) for line in text.splitlines()]
    kept: list[str] = []
    skipping, depth = False, 0
    for line in lines:
        if TEST_ONLY.match(line):
            skipping, depth = True, 0
            continue
        if skipping:
            depth += line.count("{") - line.count("}")
            if depth <= 0 and (";" in line or "}" in line):
                skipping = False
            continue
        kept.append(line)
    return "\n".join(kept)


def expand_use(tree: str) -> list[str]:
    """`a::{b, c::{d, e}}` -> ["a::b", "a::c::d", "a::c::e"] (aliases and globs dropped)."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    if "{" not in tree:
        return [tree.removesuffix("::*")]
    head, rest = tree.split("{", 1)
    inner = rest[: rest.rfind("}")]
    items, level, start = [], 0, 0
    for i, ch in enumerate(inner):
        level += ch == "{"
        level -= ch == "}"
        if ch == "," and level == 0:
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    out: list[str] = []
    for item in filter(None, items):
        for path in expand_use(item):
            out.append(head + path if path != "self" else head.removesuffix("::"))
    return out


class Crate:
    def __init__(self, src: Path = SRC) -> None:
        self.files = {module_of(p): p for p in sorted(src.rglob("*.rs")) if not is_test_file(p)}
        self.text = {m: without_tests_and_comments(p.read_text()) for m, p in self.files.items()}
        # name -> absolute path, for the names each module re-exports with `pub use`.
        self.reexports: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}
        for module, text in self.text.items():
            names: dict[str, tuple[str, ...]] = {}
            for match in USE.finditer(text):
                if not match.group(1):
                    continue
                for path in expand_use(match.group(2)):
                    absolute = self.absolute(module, path)
                    if absolute:
                        names[absolute[-1]] = absolute
            self.reexports[module] = names

    def absolute(self, module: tuple[str, ...], path: str) -> tuple[str, ...] | None:
        parts = path.split("::")
        if parts[0] == "crate":
            base: tuple[str, ...] = ()
            parts = parts[1:]
        elif parts[0] in ("super", "self"):
            base = module
            while parts and parts[0] in ("super", "self"):
                if parts[0] == "super":
                    base = base[:-1]
                parts = parts[1:]
        else:
            # A path relative to the module itself (`use error::X` in a mod.rs).
            return module + tuple(parts) if module + tuple(parts[:1]) in self.files else None
        return base + tuple(parts)

    def defining_file(self, path: tuple[str, ...], seen: int = 0) -> tuple[str, ...]:
        """The module file that defines `path`: its longest prefix that is a module file,
        following a `pub use` there to where the name comes from."""
        for cut in range(len(path), -1, -1):
            module = path[:cut]
            if module in self.files:
                rest = path[cut:]
                target = self.reexports.get(module, {}).get(rest[0]) if rest else None
                if target and target[:-1] != module and seen < 8:
                    return self.defining_file(target + rest[1:], seen + 1)
                return module
        return ()

    def imports(self) -> dict[tuple[str, ...], set[tuple[str, ...]]]:
        graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {m: set() for m in self.files}
        for module, text in self.text.items():
            paths = [p for m in USE.finditer(text) for p in expand_use(m.group(2))]
            code = VISIBILITY.sub("", USE.sub("", text))
            paths += PATH.findall(code)
            # `child::item` inside a module that declares `child`.
            paths += [
                f"self::{child}"
                for child in set(CHILD.findall(code))
                if module + (child,) in self.files
            ]
            for path in paths:
                absolute = self.absolute(module, path)
                if absolute is None:
                    continue
                target = self.defining_file(absolute)
                if target != module and target in self.files and target != ():
                    graph[module].add(target)
        return graph


def circles(graph: dict[tuple[str, ...], set[tuple[str, ...]]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan's algorithm)."""
    index: dict[tuple[str, ...], int] = {}
    low: dict[tuple[str, ...], int] = {}
    stack: list[tuple[str, ...]] = []
    on_stack: set[tuple[str, ...]] = set()
    found: list[list[str]] = []

    def visit(node: tuple[str, ...]) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(name(top))
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in graph:
        if node not in index:
            visit(node)
    return found


def name(module: tuple[str, ...]) -> str:
    return "crate::" + "::".join(module) if module else "crate"


def test_the_reader_sees_the_imports_it_must():
    graph = Crate().imports()
    # Handlers take the batching front door, and the server wires everything up; a name a
    # folder's mod.rs re-exports counts for the file that defines it.
    assert ("infer",) in graph[("http", "embed")]
    assert ("http",) in graph[("server",)]
    assert ("backend", "executor", "handle") in graph[("server",)]
    assert ("schedule",) in graph[("server",)]


def test_expand_use_reads_nested_groups():
    assert expand_use("super::{a, b::{c, d as e}, f::*}") == [
        "super::a",
        "super::b::c",
        "super::b::d",
        "super::f",
    ]


def test_no_file_of_the_router_imports_itself_through_others():
    found = circles(Crate().imports())
    assert not found, "import circles in rust_router/src:\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


if __name__ == "__main__":
    graph = Crate().imports()
    for module in sorted(graph, key=name):
        print(f"{name(module)} -> {', '.join(sorted(name(t) for t in graph[module]))}")
    for circle in circles(graph):
        print("circle:", " <-> ".join(circle))
