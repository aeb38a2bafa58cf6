"""The package's layout: its modules import one way only (rdmavisor/vconn.py
says in which order), at the top of the module; the names the package had
before it was split are still where they were; no function is over 80
lines and no file over 600."""

import ast
import importlib
import os

_PYTHON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = os.path.join(_PYTHON, "rdmavisor")

# Each module imports only modules before it.
ORDER = ["errors", "_frame", "_wait", "_session", "_addr", "_stage", "_region", "_conn", "_listener", "_client",
         "vconn", "__init__"]

NAMES = {
    "rdmavisor": ["Client", "VConn", "Listener", "Region", "Message", "ACCESS_READ", "ACCESS_WRITE", "VConnError",
                  "split_addr", "AgentGoneError", "ClosedError", "DeadlineExceeded", "from_code"],
    "rdmavisor.vconn": ["ACCESS_READ", "ACCESS_WRITE", "CLOSE_TIMEOUT", "ENV_SOCKET", "RECV_WINDOW", "Client",
                        "Listener", "Message", "NOT_READY", "Region", "Session", "VConn", "Waitable", "join_addr",
                        "split_addr", "AgentGoneError", "BadRequestError", "ClosedError", "NoHandleError",
                        "NotStreamError", "TooLargeError", "UnknownHostError", "VConnError"],
}


def _tree(path):
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def _imports(tree):
    """The package's modules a module imports, and whether every import is
    at the module's top level."""
    got, top = set(), True
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            got.update([node.module] if node.module else [a.name for a in node.names])
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node not in tree.body:
            top = False
    return got, top


def test_modules_import_one_way_at_the_top():
    names = sorted(n[:-3] for n in os.listdir(_PACKAGE) if n.endswith(".py"))
    assert names == sorted(ORDER), "a module was added or removed: place it in ORDER (and in vconn.py's docstring)"
    for i, name in enumerate(ORDER):
        got, top = _imports(_tree(os.path.join(_PACKAGE, name + ".py")))
        assert top, f"{name}: an import below the module's top"
        later = got - set(ORDER[:i])
        assert not later, f"{name} imports {sorted(later)}, which come after it"


def test_names_stay_importable():
    for module, names in NAMES.items():
        m = importlib.import_module(module)
        missing = [n for n in names if not hasattr(m, n)]
        assert not missing, f"{module} lost {missing}"


def test_sizes():
    for d in ("rdmavisor", "tests", "_build"):
        for name in sorted(os.listdir(os.path.join(_PYTHON, d))):
            if not name.endswith(".py"):
                continue
            path = os.path.join(_PYTHON, d, name)
            rel = os.path.join(d, name)
            with open(path, encoding="utf-8") as f:
                assert len(f.readlines()) <= 600, f"{rel}: over 600 lines"
            for node in ast.walk(_tree(path)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    assert n <= 80, f"{rel}:{node.lineno}: {node.name} is {n} lines, over 80"
