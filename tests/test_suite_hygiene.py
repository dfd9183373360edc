"""The test suite shares its helpers: no test module imports another test module (what they share
lives in conftest.py, tests/_fixtures_*.py and tests/_helpers_*.py), and every fixture name means
one thing (no test module defines a fixture, or a top-level helper, under a name the shared
modules define)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_fixture(node: ast.expr) -> bool:
    """@pytest.fixture, @pytest.fixture(...), @fixture, @fixture(...)."""
    target = node.func if isinstance(node, ast.Call) else node
    return (isinstance(target, ast.Attribute) and target.attr == "fixture") or \
        (isinstance(target, ast.Name) and target.id == "fixture")


def fixtures(tree: ast.Module) -> list[str]:
    """The fixtures a module defines at its top level, by name."""
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and any(_is_fixture(d) for d in node.decorator_list)]


def public_helpers(tree: ast.Module) -> set[str]:
    """The module's top-level functions and classes whose names do not start with an underscore."""
    return {node.name for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not node.name.startswith("_")}


def imported_test_modules(tree: ast.Module) -> list[str]:
    """Every test module the code imports, anywhere in it (functions included)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + ([f"{node.module}.{a.name}" for a in node.names] if node.module == "tests" else [])
        else:
            continue
        found += [n for n in names if n.split(".")[-1].startswith("test_") and n.split(".")[0] in ("tests", n)]
    return found


def problems(folder: Path) -> list[str]:
    """What breaks the rules in a tests folder, one line each."""
    shared_modules = [folder / "conftest.py", *sorted(folder.glob("_fixtures_*.py")),
                      *sorted(folder.glob("_helpers_*.py"))]
    shared: dict[str, str] = {}
    helpers: dict[str, str] = {}
    out = []
    for path in shared_modules:
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(), str(path))
        for name in fixtures(tree):
            if name in shared:
                out.append(f"{path.name}: fixture {name!r} is already defined in {shared[name]}")
            shared.setdefault(name, path.name)
        for name in public_helpers(tree) - set(fixtures(tree)):
            helpers.setdefault(name, path.name)
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        out += [f"{path.name}: imports the test module {name}" for name in imported_test_modules(tree)]
        if path in shared_modules:
            continue
        out += [f"{path.name}: fixture {name!r} shadows the one in {shared[name]}"
                for name in fixtures(tree) if name in shared]
        out += [f"{path.name}: defines {name!r} again (use the one in {helpers[name]})"
                for name in sorted(public_helpers(tree)) if name in helpers]
    return out


def test_no_test_module_imports_another_and_no_fixture_shadows_a_shared_one():
    assert problems(TESTS) == []


def test_the_check_finds_an_imported_test_module_a_shadowed_fixture_and_a_copied_helper(tmp_path):
    (tmp_path / "conftest.py").write_text("from _fixtures_x import *\n")
    (tmp_path / "_fixtures_x.py").write_text(
        "import pytest\n\n@pytest.fixture(scope='session')\ndef farm():\n    return 1\n\n"
        "def register(api):\n    return api\n")
    (tmp_path / "test_a.py").write_text("import pytest\n\nHOST = 1\n\n@pytest.fixture\ndef own():\n    return 2\n")
    assert problems(tmp_path) == []
    (tmp_path / "test_b.py").write_text(
        "import pytest\nfrom test_a import HOST\n\n@pytest.fixture\ndef farm():\n    return 3\n\n"
        "def register(api):\n    return api\n\n"
        "def test_x():\n    import tests.test_a\n    from tests import test_a\n")
    assert problems(tmp_path) == [
        "test_b.py: imports the test module test_a",
        "test_b.py: imports the test module tests.test_a",
        "test_b.py: imports the test module tests.test_a",
        "test_b.py: fixture 'farm' shadows the one in _fixtures_x.py",
        "test_b.py: defines 'register' again (use the one in _fixtures_x.py)",
    ]
    (tmp_path / "_fixtures_y.py").write_text("from pytest import fixture\n\n@fixture\ndef farm():\n    return 4\n")
    assert "_fixtures_y.py: fixture 'farm' is already defined in _fixtures_x.py" in problems(tmp_path)
