"""The planner stays pure: stdlib imports only, no clock, no randomness, no file I/O."""

import ast
import sys
from pathlib import Path

import scheduler

PACKAGE = Path(scheduler.__file__).parent
FORBIDDEN_MODULES = {"time", "random", "datetime", "os", "io", "pathlib", "subprocess", "socket", "shutil"}
FORBIDDEN_CALLS = {"open", "print", "input", "eval", "exec"}


def _modules():
    return sorted(PACKAGE.glob("*.py"))


def test_only_stdlib_and_own_imports():
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top == "scheduler" or (top in sys.stdlib_module_names and top not in FORBIDDEN_MODULES), (
                    f"{path.name} imports {name}"
                )


def test_no_io_or_clock_calls():
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in FORBIDDEN_CALLS, f"{path.name} calls {node.func.id}()"
