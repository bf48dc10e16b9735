"""tools/import_cycles.py on small synthetic packages: a real circle is found (through a
TYPE_CHECKING import, a function-local import and a relative import), a DAG reports none, and
the command's exit code and JSON say so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tools.import_cycles import circle_longer_than, components, graph

TOOL = Path(__file__).resolve().parents[2] / "tools" / "import_cycles.py"


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


CIRCLE = {
    "pkg/__init__.py": "",
    "pkg/a.py": "from pkg.b import B\n",
    # the circle closes only through imports that do not run at import time
    "pkg/b.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.c import C\nB = 1\n"),
    "pkg/sub/__init__.py": "",
    "pkg/sub/c.py": "def f():\n    from .. import a\n    return a\n",
    "pkg/d.py": "import pkg.a\nimport json\n",  # imports into the circle, not part of it
}

DAG = {
    "pkg/__init__.py": "",
    "pkg/a.py": "from pkg import b\nfrom pkg.sub import c\n",
    "pkg/b.py": "from .sub.c import C\n",
    "pkg/sub/__init__.py": "",
    "pkg/sub/c.py": "import os\nC = os.sep\n",
}


def run(package: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), str(package), *args], capture_output=True, text=True, timeout=60)


def test_a_circle_through_type_checking_local_and_relative_imports_is_found(tmp_path: Path) -> None:
    pkg = write(tmp_path, CIRCLE)
    edges = graph(pkg)
    assert edges["pkg.a"] == {"pkg.b"}
    assert edges["pkg.b"] == {"pkg.sub.c"}
    assert edges["pkg.sub.c"] == {"pkg.a"}  # ``from .. import a``: the module pkg.a
    assert edges["pkg.d"] == {"pkg.a"}  # json is not the package's
    assert components(edges)[0] == ["pkg.a", "pkg.b", "pkg.sub.c"]
    done = run(pkg)
    assert done.returncode == 1
    assert "3 files: pkg.a pkg.b pkg.sub.c" in done.stdout
    report = json.loads(run(pkg, "--json").stdout)
    assert report["cycles"] == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    assert report["modules"] == 6


def test_a_dag_reports_no_circle(tmp_path: Path) -> None:
    pkg = write(tmp_path, DAG)
    edges = graph(pkg)
    assert edges["pkg.a"] == {"pkg.b", "pkg.sub.c"}
    assert edges["pkg.b"] == {"pkg.sub.c"}
    assert all(len(c) == 1 for c in components(edges))
    done = run(pkg, "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["cycles"] == []


def test_a_two_file_circle_is_reported_only_when_asked(tmp_path: Path) -> None:
    pkg = write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": "import pkg.a\n"})
    assert run(pkg).returncode == 0
    done = run(pkg, "--min-files", "1")
    assert done.returncode == 1
    assert "2 files: pkg.a pkg.b" in done.stdout


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    done = run(tmp_path / "nowhere")
    assert done.returncode == 2
    assert "not a package directory" in done.stderr
    pkg = write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "def (:\n"})
    done = run(pkg)
    assert done.returncode == 2
    assert "cannot parse" in done.stderr and "a.py" in done.stderr


def test_pairs_through_one_hub_are_not_a_longer_circle_but_a_third_edge_makes_one(tmp_path: Path) -> None:
    """A hub whose helpers each import it back for its type is one component of pairs: named, not
    failed. One helper importing another closes hub -> a -> b -> hub, a circle of three files."""
    star = {
        "pkg/__init__.py": "",
        "pkg/hub.py": "from pkg import a, b\n",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.hub import Hub\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.hub import Hub\n",
    }
    pkg = write(tmp_path / "star", star)
    assert components(graph(pkg))[0] == ["pkg.a", "pkg.b", "pkg.hub"]
    done = run(pkg, "--json")
    assert done.returncode == 0
    report = json.loads(done.stdout)
    assert report["cycles"] == [] and report["pairs"] == [["pkg.a", "pkg.b", "pkg.hub"]]
    pkg = write(tmp_path / "three", {**star, "pkg/a.py": star["pkg/a.py"] + "from pkg import b\n"})
    edges = graph(pkg)
    assert circle_longer_than(["pkg.a", "pkg.b", "pkg.hub"], edges, 2) == ["pkg.a", "pkg.b", "pkg.hub"]
    done = run(pkg)
    assert done.returncode == 1
    assert "for one: pkg.a -> pkg.b -> pkg.hub -> pkg.a" in done.stdout


def test_fabric_has_no_circle_of_more_than_two_files() -> None:
    """The bar: no closed path of imports through more than two files anywhere in fabric/ (the
    node's handlers import Broker back for its type: pairs, each of two files)."""
    fabric = Path(__file__).resolve().parents[2] / "fabric"
    edges = graph(fabric)
    assert [c for c in components(edges) if len(c) > 2 and circle_longer_than(c, edges, 2)] == []
