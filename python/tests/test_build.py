"""The in-tree build backend: a wheel pip accepts, and an sdist."""

import base64
import hashlib
import os
import sys
import tarfile
import zipfile

_BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_build")
sys.path.insert(0, _BUILD)
import backend  # noqa: E402

sys.path.remove(_BUILD)


def test_wheel_lists_every_file_with_its_hash(tmp_path):
    name = backend.build_wheel(str(tmp_path))
    assert name == "rdmavisor-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(tmp_path / name) as z:
        names = set(z.namelist())
        modules = {f"rdmavisor/{n}" for n in os.listdir(os.path.join(os.path.dirname(_BUILD), "rdmavisor"))
                   if n.endswith(".py")}
        assert {"rdmavisor/__init__.py", "rdmavisor/vconn.py", "rdmavisor/_conn.py"} <= modules  # every module
        assert modules | {"rdmavisor-0.1.0.dist-info/METADATA"} <= names
        record = z.read("rdmavisor-0.1.0.dist-info/RECORD").decode().splitlines()
        listed = set()
        for line in record:
            path, digest, size = line.rsplit(",", 2)
            listed.add(path)
            if path.endswith("RECORD"):
                continue
            data = z.read(path)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
        assert listed == names
        meta = z.read("rdmavisor-0.1.0.dist-info/METADATA").decode()
        assert "Name: rdmavisor\n" in meta and "Requires-Python: >=3.8\n" in meta


def test_sdist_builds_its_own_wheel(tmp_path):
    name = backend.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / name) as t:
        got = set(t.getnames())
    assert {"rdmavisor-0.1.0/pyproject.toml", "rdmavisor-0.1.0/_build/backend.py",
            "rdmavisor-0.1.0/rdmavisor/_session.py", "rdmavisor-0.1.0/PKG-INFO"} <= got
    assert not any("tests" in n or "__pycache__" in n for n in got)


def test_nothing_to_install_first():
    assert backend.get_requires_for_build_wheel() == []
    assert backend.get_requires_for_build_sdist() == []
