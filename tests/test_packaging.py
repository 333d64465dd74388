"""Packaging promises: tested dependency ranges (a wrong wgpu-py is refused at import), the
license texts the metadata declares, `python -m wgrumus`, and what a wheel install holds."""
import subprocess
import sys
import zipfile

import pytest
import tomllib
from _util import ROOT, run_process

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirement(name):
    return next(d for d in PYPROJECT["dependencies"] if d.split(">")[0].split("<")[0] == name)


def test_dependencies_have_tested_ranges():
    from wgrumus._deps import WGPU_RANGE
    assert _requirement("wgpu") == f"wgpu{WGPU_RANGE}"
    for name in ("numpy", "rich", "safetensors"):
        req = _requirement(name)
        assert ">=" in req and "<" in req.replace(">=", ""), req


def test_ci_installs_the_lowest_wgpu_of_the_range_and_runs_the_demo():
    """The floor pyproject states is the one CI tries: `.ci/run` reads it from there."""
    from packaging.requirements import Requirement
    lowest = next(s.version for s in Requirement(_requirement("wgpu")).specifier
                  if s.operator == ">=")
    ci = (ROOT / ".ci" / "run").read_text()
    assert "wgpu_floor" in ci and "wgrumus demo" in ci
    from wgrumus._deps import wgpu_in_range
    assert wgpu_in_range(lowest) and wgpu_in_range(lowest + ".0")


@pytest.mark.parametrize("version,ok", [("0.28.1", False), ("0.29.0", True), ("0.32.0", True),
                                        ("0.32.1rc1", True), ("0.33.0", False),
                                        ("0.33.0.dev1", False), ("unknown", False)])
def test_wgpu_range_check(version, ok):
    from wgrumus._deps import wgpu_in_range
    assert wgpu_in_range(version) is ok


def test_installed_wgpu_is_in_the_tested_range():
    import wgpu

    from wgrumus._deps import check_wgpu
    check_wgpu(wgpu.__version__)  # the suite itself runs on a tested release


@pytest.mark.parametrize("version", ["0.28.1", "0.33.0", "1.0.0"])
def test_untested_wgpu_is_refused_at_import(tmp_path, version):
    """A wgpu-py outside the range fails `import wgrumus` with the pip command that fixes it,
    not later inside a training step."""
    from wgrumus._deps import WGPU_RANGE
    fake = tmp_path / "wgpu"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"__version__ = {version!r}\n")
    p = run_process([sys.executable, "-c", "import wgrumus"], 60,
                    PYTHONPATH=f"{tmp_path}:{ROOT}")
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: wgrumus needs wgpu{WGPU_RANGE}") and version in last
    assert f"pip install 'wgpu{WGPU_RANGE}'" in last
    p = run_process([sys.executable, "-c", "import wgrumus"], 60,
                    PYTHONPATH=f"{tmp_path}:{ROOT}", WGRUMUS_ANY_WGPU="1")
    assert "wgrumus needs wgpu" not in p.stderr  # the escape hatch skips the check


def test_license_files_match_the_declared_license():
    assert PYPROJECT["license"] == "(Apache-2.0 OR MIT) AND BSD-3-Clause AND CC-BY-4.0"
    assert sorted(PYPROJECT["license-files"]) == ["LICENSE-APACHE", "LICENSE-MIT",
                                                  "wgrumus/data/files/README.md"]
    apache = (ROOT / "LICENSE-APACHE").read_text()
    assert apache.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in apache
    assert "END OF TERMS AND CONDITIONS" in apache
    mit = (ROOT / "LICENSE-MIT").read_text()
    assert mit.startswith("MIT License") and "Permission is hereby granted, free of charge" in mit
    data = (ROOT / "wgrumus/data/files/README.md").read_text()
    assert "BSD 3-Clause License" in data and "CC BY 4.0" in data  # the digits' two licences
    assert "Apache-2.0 OR MIT" in (ROOT / "README.md").read_text()


def test_readme_links_work_in_the_package_description():
    """README.md is the wheel's long description, shown on package indexes where a link
    relative to the repository leads nowhere: links are absolute (files are named as text)."""
    import re
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)]+)\)", readme)
    assert all(u.startswith(("https://", "http://")) for u in links), links


@pytest.mark.timeout(60)
def test_python_dash_m_wgrumus_is_the_command():
    p = run_process([sys.executable, "-m", "wgrumus", "--version"], 50)
    assert p.returncode == 0 and p.stdout.startswith("wgrumus "), p.stderr
    p = run_process([sys.executable, "-m", "wgrumus", "train", "mlp", "--steps", "0"], 50)
    assert p.returncode == 2 and "--steps: must be > 0" in p.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel `pip wheel .` builds (hatchling comes with the `test` extra)."""
    pytest.importorskip("hatchling", reason="pip install -e '.[test]' brings hatchling")
    out = tmp_path_factory.mktemp("wheel")
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(out), str(ROOT)], capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    return next(out.glob("wgrumus-*.whl"))


@pytest.mark.timeout(300)
def test_wheel_metadata_and_contents(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: (Apache-2.0 OR MIT) AND BSD-3-Clause AND CC-BY-4.0" in meta
    assert "License-File: LICENSE-APACHE" in meta and "License-File: LICENSE-MIT" in meta
    assert "License-File: wgrumus/data/files/README.md" in meta
    assert "Requires-Dist: wgpu<0.33,>=0.29" in meta and "Requires-Dist: packaging" in meta
    assert "Classifier: Programming Language :: Python :: 3" in meta
    assert any(n.endswith("licenses/LICENSE-APACHE") for n in names)
    assert any(n.endswith("licenses/wgrumus/data/files/README.md") for n in names)
    assert "wgrumus/__main__.py" in names and "wgrumus/shaders/map.wgsl" in names
    assert any(n.startswith("wgrumus/data/files/") for n in names)  # digits and text ship


@pytest.mark.timeout(300)
def test_wheel_install_runs_and_bench_says_where_the_benchmarks_are(wheel, tmp_path):
    """Installed from the wheel (no checkout on the path), the command works and `bench`
    explains in one line that the benchmarks come with a source checkout (as README says)."""
    site = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(site), str(wheel)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    env = {"PYTHONPATH": str(site)}
    run = lambda *a: subprocess.run([sys.executable, "-m", "wgrumus", *a],  # noqa: E731
                                    cwd=tmp_path, capture_output=True, text=True, timeout=60,
                                    env={**__import__("os").environ, **env})
    r = run("--version")
    assert r.returncode == 0, r.stderr
    r = run("bench", "--list")
    assert r.returncode == 2 and "source checkout" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    readme = (ROOT / "README.md").read_text()
    assert "benchmarks are not in the wheel" in readme
