"""A PEP 517 build backend in the standard library alone, so that
`pip install ./python` needs no compiler, no index and no setuptools or
wheel: the package is pure Python, and a wheel of it is a zip file.

It builds wheels (and editable wheels, PEP 660) and sdists from the
[project] table of pyproject.toml, read by a line parser that knows the
few forms that file uses (tomllib is not in every Python this supports).
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE = "rdmavisor"


def _project():
    """The [project] table's string values."""
    out, section = {}, None
    with open(os.path.join(_ROOT, "pyproject.toml"), encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            m = re.fullmatch(r"\[([^\]]+)\]", line)
            if m:
                section = m.group(1)
                continue
            m = re.fullmatch(r'([A-Za-z0-9_-]+)\s*=\s*"([^"]*)"', line)
            if section == "project" and m:
                out[m.group(1)] = m.group(2)
    for key in ("name", "version"):
        if key not in out:
            raise ValueError(f"pyproject.toml: [project] has no {key}")
    return out


def _dist(p):
    return f"{p['name'].replace('-', '_')}-{p['version']}"


def _metadata(p):
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}"]
    if "description" in p:
        lines.append(f"Summary: {p['description']}")
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    body = ""
    if "readme" in p:
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(_ROOT, p["readme"]), encoding="utf-8") as f:
            body = "\n" + f.read()
    return "\n".join(lines) + "\n" + body


def _sources():
    """The package's modules, as (path in the archive, bytes)."""
    out = []
    base = os.path.join(_ROOT, _PACKAGE)
    for name in sorted(os.listdir(base)):
        if name.endswith(".py"):
            with open(os.path.join(base, name), "rb") as f:
                out.append((f"{_PACKAGE}/{name}", f.read()))
    return out


def _wheel(wheel_directory, files):
    p = _project()
    dist = _dist(p)
    info = f"{dist}.dist-info"
    files = files + [
        (f"{info}/METADATA", _metadata(p).encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: rdmavisor _build/backend.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{info}/top_level.txt", f"{_PACKAGE}\n".encode()),
    ]
    record = io.StringIO()
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{path},sha256={digest},{len(data)}\n")
    record.write(f"{info}/RECORD,,\n")
    files.append((f"{info}/RECORD", record.getvalue().encode()))
    name = f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            zi = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, _sources())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """A wheel whose .pth file puts the source tree on sys.path."""
    return _wheel(wheel_directory, [(f"_{_PACKAGE}_editable.pth", (_ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    dist = _dist(p)
    name = f"{dist}.tar.gz"
    members = [("pyproject.toml", None), ("README.md", None), ("_build/backend.py", None)]
    members += [(path, data) for path, data in _sources()]
    members.append(("PKG-INFO", _metadata(p).encode()))
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for path, data in members:
            if data is None:
                with open(os.path.join(_ROOT, path), "rb") as f:
                    data = f.read()
            ti = tarfile.TarInfo(f"{dist}/{path}")
            ti.size, ti.mode = len(data), 0o644
            t.addfile(ti, io.BytesIO(data))
    return name
