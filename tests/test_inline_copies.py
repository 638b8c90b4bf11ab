"""Hand-inlined copies of hot-path code still match the functions they copy.

A few per-message paths copy a function's statements instead of calling it (a call
costs a Python frame). Each copy sits between two fence comments, on lines of their
own::

    # inline: meshbus._egress.Egress.push begin
    # inline-with: self -> egress
    ...the copied statements...
    # inline: meshbus._egress.Egress.push end

``inline:`` names the function copied by its import path, then ``begin`` or ``end``.
The ``inline-with:`` lines right after ``begin`` declare how the copy differs, as
``OLD -> NEW``: the source's expression ``OLD`` (a name such as ``self``, or any
expression) is the copy's ``NEW``. Without more, the copy is the function's whole
body (its docstring aside). A copy of only some statements names a part in brackets,
``meshbus._egress.Egress.get_nowait[take]``, and the function fences that part::

    # inline-source: take begin
    ...the statements copied...
    # inline-source: take end

The source's statements, with the replacements made, and the copy's are compared as
syntax trees: comments, layout and the annotation of a local name do not count,
anything else does. Every fence in the package folders is checked, so a new fence
needs nothing here; a fence whose function or part cannot be found fails, as do a
replacement that no longer applies and a source part that nothing copies.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib
import inspect
import re
import sys
import tokenize
import tomllib
import types
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent

_COPY = re.compile(r"#\s*inline:\s*(?P<target>[\w.]+)(?:\[(?P<part>\w+)\])?\s+(?P<edge>begin|end)$")
_WITH = re.compile(r"#\s*inline-with:\s*(?P<old>.+?)\s*->\s*(?P<new>.+)$")
_SOURCE = re.compile(r"#\s*inline-source:\s*(?P<part>\w+)\s+(?P<edge>begin|end)$")
_ANY = re.compile(r"#\s*inline(-\w+)?:")  # whatever looks like a fence must be one


class Copy(NamedTuple):
    """A fenced copy: where it is, what it copies, and how it differs."""

    path: Path
    begin: int
    end: int
    target: str
    part: str | None
    replacements: tuple[tuple[str, str], ...]

    def __str__(self) -> str:
        name = self.target + (f"[{self.part}]" if self.part else "")
        where = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{where}:{self.begin} {name}"


class Part(NamedTuple):
    """A fenced part of a source function."""

    path: Path
    begin: int
    end: int
    name: str


class Fences(NamedTuple):
    copies: list[Copy]
    parts: list[Part]
    problems: list[str]


# --- finding fences -----------------------------------------------------------------------


def package_folders() -> list[Path]:
    """The folders that make up the meshbus package, as pyproject.toml maps them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [ROOT / folder for folder in config["tool"]["setuptools"]["package-dir"].values()]


def scan(paths: Iterable[Path]) -> Fences:
    found = Fences([], [], [])
    for path in sorted(paths):
        one = scan_file(path)
        found.copies.extend(one.copies)
        found.parts.extend(one.parts)
        found.problems.extend(one.problems)
    return found


@cache
def scan_file(path: Path) -> Fences:
    found = Fences([], [], [])
    opened: tuple[re.Match[str], int] | None = None
    replacements: list[tuple[str, str]] = []
    with tokenize.open(path) as file:
        comments = [
            (token.start[0], token.string.strip(), token.line.strip() == token.string.strip())
            for token in tokenize.generate_tokens(file.readline)
            if token.type == tokenize.COMMENT
        ]
    for line, text, alone in comments:
        if not _ANY.match(text):
            continue
        where = f"{path}:{line}"
        match = _COPY.match(text) or _WITH.match(text) or _SOURCE.match(text)
        if match is None:
            found.problems.append(f"{where}: not a well-formed fence: {text!r}")
            continue
        if not alone:
            found.problems.append(f"{where}: a fence must be a line of its own")
            continue
        if match.re is _WITH:
            if opened is None or opened[0].re is not _COPY or line != opened[1] + 1:
                found.problems.append(f"{where}: inline-with must follow an inline begin")
            else:
                replacements.append((match["old"], match["new"]))
                opened = (opened[0], line)
            continue
        if match["edge"] == "begin":
            if opened is not None:
                found.problems.append(f"{where}: a fence begins inside another")
            opened, begin, replacements = (match, line), line, []
            continue
        if opened is None or opened[0].re is not match.re or opened[0]["edge"] != "begin":
            found.problems.append(f"{where}: an end without its begin")
        elif match.re is _COPY and (match["target"], match["part"]) != (
            opened[0]["target"],
            opened[0]["part"],
        ):
            found.problems.append(f"{where}: this end names another copy than its begin")
        elif match.re is _COPY:
            found.copies.append(
                Copy(path, begin, line, match["target"], match["part"], tuple(replacements))
            )
        else:
            found.parts.append(Part(path, begin, line, match["part"]))
        opened = None
    if opened is not None:
        found.problems.append(f"{path}:{begin}: a fence with no end")
    return found


# --- statements between fences --------------------------------------------------------------


class FenceError(Exception):
    pass


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def fenced(tree: ast.AST, begin: int, end: int) -> list[ast.stmt]:
    """The statements between the lines ``begin`` and ``end``: whole statements, of one block."""
    blocks = []
    for owner in ast.walk(tree):
        for _, value in ast.iter_fields(owner):
            if not (isinstance(value, list) and value and isinstance(value[0], ast.stmt)):
                continue
            for stmt in value:
                if _crosses(stmt, begin, end):
                    raise FenceError(f"line {stmt.lineno}: a statement crosses the fence")
            owner_inside = isinstance(owner, ast.stmt | ast.excepthandler) and (
                begin < owner.lineno and (owner.end_lineno or 0) < end
            )
            block = [s for s in value if begin < s.lineno and (s.end_lineno or 0) < end]
            if block and not owner_inside:
                blocks.append(block)
    if not blocks:
        raise FenceError("nothing between the fences")
    if len(blocks) > 1:
        raise FenceError("the fenced statements are not in one block")
    return blocks[0]


def _crosses(stmt: ast.stmt, begin: int, end: int) -> bool:
    """Whether the fence cuts ``stmt``, rather than hold it, miss it or lie in its body.

    A block's last lines end before the comments after them: a fence that ends there
    (after the last statement of a loop, say) does not cut the loop.
    """
    first, last = stmt.lineno, stmt.end_lineno or stmt.lineno
    if last < begin or first > end or (begin < first and last < end):
        return False
    if first > begin:
        return True  # begins inside, ends after the fence
    header = [
        getattr(part, "end_lineno", None) or 0  # ``arguments`` has no lines of its own
        for n in ast.iter_child_nodes(stmt)
        if not isinstance(n, ast.stmt | ast.excepthandler | ast.match_case)
        for part in ast.walk(n)
    ]
    return begin <= max([first, *header])  # in its header, or in a simple statement


def resolve(target: str) -> types.FunctionType:
    """The function called ``target`` (``package.module.Class.method``)."""
    names = target.split(".")
    for i in range(len(names) - 1, 0, -1):
        try:
            found: object = importlib.import_module(".".join(names[:i]))
        except ModuleNotFoundError:
            continue
        try:
            for name in names[i:]:
                found = getattr(found, name)
        except AttributeError:
            break
        found = inspect.unwrap(found)  # type: ignore[arg-type]
        if isinstance(found, types.FunctionType):
            return found
        raise FenceError(f"{target} is not a function")
    raise FenceError(f"there is no function {target}")


def source_of(fence: Copy) -> tuple[list[ast.stmt], Part | None]:
    """The statements ``fence`` copies, and the source part they come from (if any)."""
    function = resolve(fence.target)
    path = Path(inspect.getsourcefile(function) or "").resolve()
    first = function.__code__.co_firstlineno  # the first decorator's line, if any
    [node] = [
        n
        for n in ast.walk(parsed(path))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and min([n.lineno, *(d.lineno for d in n.decorator_list)]) == first
    ]
    if fence.part is None:
        body = node.body
        if ast.get_docstring(node, clean=False) is not None:
            body = body[1:]
        return body, None
    # A part begins inside the function; one that ends outside it crosses the def.
    parts = [
        p
        for p in scan_file(path).parts
        if p.name == fence.part and node.lineno < p.begin < (node.end_lineno or 0)
    ]
    if len(parts) != 1:
        raise FenceError(f"{fence.target} has {len(parts)} parts called {fence.part!r}, not 1")
    return fenced(parsed(path), parts[0].begin, parts[0].end), parts[0]


# --- comparing --------------------------------------------------------------------------------


class _Normalise(ast.NodeTransformer):
    """What does not change behaviour: load or store context, a local name's annotation."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if hasattr(node, "ctx"):
            node.ctx = ast.Load()
        return super().generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        self.generic_visit(node)
        if node.simple and node.value is not None:
            return ast.Assign(targets=[node.target], value=node.value)
        return node


def dump(node: ast.AST) -> str:
    return ast.dump(_Normalise().visit(copy.deepcopy(node)))


class _Replace(ast.NodeTransformer):
    def __init__(self, replacements: list[tuple[ast.expr, ast.expr]]) -> None:
        self.replacements = [(dump(old), new) for old, new in replacements]
        self.used = [0] * len(replacements)

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.expr):
            key = dump(node)
            for i, (old, new) in enumerate(self.replacements):
                if key == old:
                    self.used[i] += 1
                    return copy.deepcopy(new)  # in the copy's terms: not replaced again
        return super().visit(node)


def compare(
    source: list[ast.stmt], copied: list[ast.stmt], replacements: Iterable[tuple[str, str]]
) -> list[str]:
    """Why ``copied`` is not ``source`` with ``replacements`` made (empty: it is)."""
    pairs = []
    for old, new in replacements:
        try:
            pairs.append((ast.parse(old, mode="eval").body, ast.parse(new, mode="eval").body))
        except SyntaxError:
            return [f"inline-with {old} -> {new}: not two Python expressions"]
    replace = _Replace(pairs)
    module = replace.visit(ast.Module(body=copy.deepcopy(source), type_ignores=[]))
    problems = [
        f"inline-with {old} -> {new}: the source has no {old} any more"
        for (old, new), used in zip(replacements, replace.used, strict=True)
        if not used
    ]
    expected = module.body
    if [dump(s) for s in expected] != [dump(s) for s in copied]:
        problems.append(
            "the copy differs from its source.\n--- source, replacements made:\n"
            + "\n".join(ast.unparse(s) for s in expected)
            + "\n--- copy:\n"
            + "\n".join(ast.unparse(s) for s in copied)
        )
    return problems


def check(fence: Copy) -> list[str]:
    """Why ``fence`` no longer copies its source (empty: it does)."""
    try:
        source, _ = source_of(fence)
        copied = fenced(parsed(fence.path), fence.begin, fence.end)
    except FenceError as exc:
        return [f"{fence}: {exc}"]
    return [f"{fence}: {problem}" for problem in compare(source, copied, fence.replacements)]


# --- the package's fences -----------------------------------------------------------------------

FENCES = scan(p.resolve() for folder in package_folders() for p in folder.rglob("*.py"))


@pytest.mark.parametrize("fence", FENCES.copies, ids=str)
def test_an_inlined_copy_matches_its_source(fence: Copy) -> None:
    problems = check(fence)
    assert not problems, "\n".join(problems)


def test_the_fences_are_well_formed_and_every_source_part_is_copied() -> None:
    used = set()
    for fence in FENCES.copies:
        with contextlib.suppress(FenceError):  # reported by the test of that copy
            used.add(source_of(fence)[1])
    orphans = [
        f"{p.path}:{p.begin}: nothing copies part {p.name!r}" for p in FENCES.parts if p not in used
    ]
    assert not FENCES.problems + orphans, "\n".join(FENCES.problems + orphans)


def test_the_hot_path_copies_are_fenced() -> None:
    # Guards the scan itself: an empty parametrisation above would pass unseen.
    names = {f"{c.path.relative_to(ROOT)} {c.target}[{c.part}]" for c in FENCES.copies}
    assert names >= {
        "plugins/direct.py meshbus._egress.Egress.push[None]",
        "sdk/_session.py meshbus._egress.Egress.get_nowait[take]",
        "sdk/_session.py meshbus._egress.Egress.get_nowait[drained]",
        "sdk/_session.py meshbus._messages.make_message[build]",
        "sdk/_session.py meshbus._vpn.Vpn.dispatch[defer]",
        "sdk/_session.py meshbus._vpn.Vpn.dispatch[route]",
    }


# --- the check itself, on made-up modules -------------------------------------------------------

SOURCE = '''
class Box:
    def put(self, item):
        """Docstring, not copied."""
        self.items.append(item)
        # inline-source: count begin
        self.count += 1
        # inline-source: count end
'''

COPY = """
def fast(box, thing):
    # inline: {module}.Box.put begin
    # inline-with: self -> box
    # inline-with: item -> thing
    box.items.append(thing)  # comments and layout do not count
    box.count += 1
    # inline: {module}.Box.put end
    # inline: {module}.Box.put[count] begin
    # inline-with: self -> box
    box.count += 1
    # inline: {module}.Box.put[count] end
    return box
"""


@pytest.fixture
def made_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """A module with a source function, importable under a name of this test's own."""
    module = "inline_demo_" + re.sub(r"\W", "_", request.node.name)
    (tmp_path / f"{module}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)  # forgotten after the test
    return module


def check_made_up(tmp_path: Path, module: str, copy_text: str) -> list[str]:
    path = (tmp_path / "copy.py").resolve()
    path.write_text(copy_text.format(module=module))
    scan_file.cache_clear()
    parsed.cache_clear()
    fences = scan_file(path)
    assert not fences.problems
    return [problem for fence in fences.copies for problem in check(fence)]


def test_a_faithful_copy_passes(tmp_path: Path, made_up: str) -> None:
    assert check_made_up(tmp_path, made_up, COPY) == []


def test_a_copy_fails_once_its_source_changes(tmp_path: Path, made_up: str) -> None:
    source = tmp_path / f"{made_up}.py"
    source.write_text(SOURCE.replace("self.count += 1", "self.count += 2"))
    problems = check_made_up(tmp_path, made_up, COPY)
    assert len(problems) == 2  # the whole-body copy and the part's
    assert all("the copy differs from its source" in p for p in problems)
    assert "box.count += 2" in problems[0]


def test_a_copy_fails_once_a_declared_replacement_no_longer_applies(
    tmp_path: Path, made_up: str
) -> None:
    source = tmp_path / f"{made_up}.py"
    source.write_text(SOURCE.replace("append(item)", "append(None)"))
    problems = check_made_up(tmp_path, made_up, COPY)
    assert any("the source has no item any more" in p for p in problems)


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("{module}.Box.take", "there is no function"),
        ("{module}.nowhere.put", "there is no function"),
        ("{module}.Box", "is not a function"),
        ("{module}.Box.put[other]", "0 parts called 'other'"),
    ],
)
def test_a_fence_without_its_source_fails(
    tmp_path: Path, made_up: str, target: str, why: str
) -> None:
    copy_text = f"""
def fast(box):
    # inline: {target} begin
    box.count += 1
    # inline: {target} end
"""
    [problem] = check_made_up(tmp_path, made_up, copy_text)
    assert why in problem


def test_malformed_fences_are_reported(tmp_path: Path) -> None:
    path = (tmp_path / "bad.py").resolve()
    path.write_text(
        """
x = 1  # inline: a.b begin
# inline: a.b begin
# inline: a.c end
# inline-with: x -> y
# inline: keep in step
# inline-source: p begin
"""
    )
    problems = scan_file(path).problems
    assert [p.split(": ", 1)[1] for p in problems] == [
        "a fence must be a line of its own",
        "this end names another copy than its begin",
        "inline-with must follow an inline begin",
        "not a well-formed fence: '# inline: keep in step'",
        "a fence with no end",
    ]


def test_a_fence_must_hold_whole_statements_of_one_block() -> None:
    lines = ["if a:", "    b()", "    # 3", "    c(", "    )", "    # 6", "d()", "# 8"]
    tree = ast.parse("\n".join(lines))
    assert [ast.unparse(s) for s in fenced(tree, 3, 6)] == ["c()"]
    assert [ast.unparse(s) for s in fenced(tree, 0, 8)] == ["if a:\n    b()\n    c()", "d()"]
    with pytest.raises(FenceError, match="not in one block"):
        fenced(tree, 3, 8)  # from inside the if to after it
    with pytest.raises(FenceError, match="crosses the fence"):
        fenced(tree, 0, 3)  # from before the if into it
    with pytest.raises(FenceError, match="crosses the fence"):
        fenced(tree, 4, 6)  # from inside a statement
    with pytest.raises(FenceError, match="nothing between"):
        fenced(ast.parse("a()\n# 2\n# 3\nb()"), 2, 3)
