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
    from wgrumus._deps import WGPU_TESTED
    (lo0, lo1), (hi0, hi1) = WGPU_TESTED
    assert _requirement("wgpu") == f"wgpu>={lo0}.{lo1},<{hi0}.{hi1}"
    for name in ("numpy", "rich", "safetensors"):
        req = _requirement(name)
        assert ">=" in req and "<" in req.replace(">=", ""), req


def test_installed_wgpu_is_in_the_tested_range():
    import wgpu

    from wgrumus._deps import check_wgpu
    check_wgpu(wgpu.__version__)  # the suite itself runs on a tested release


@pytest.mark.parametrize("version", ["0.26.3", "0.33.0", "1.0.0"])
def test_untested_wgpu_is_refused_at_import(tmp_path, version):
    """A wgpu-py outside the range fails `import wgrumus` with the pip command that fixes it,
    not later inside a training step."""
    fake = tmp_path / "wgpu"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"__version__ = {version!r}\n")
    p = run_process([sys.executable, "-c", "import wgrumus"], 60,
                    PYTHONPATH=f"{tmp_path}:{ROOT}")
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: wgrumus needs wgpu>=0.27,<0.33") and version in last
    assert "pip install 'wgpu>=0.27,<0.33'" in last
    p = run_process([sys.executable, "-c", "import wgrumus"], 60,
                    PYTHONPATH=f"{tmp_path}:{ROOT}", WGRUMUS_ANY_WGPU="1")
    assert "wgrumus needs wgpu" not in p.stderr  # the escape hatch skips the check


def test_license_files_match_the_declared_license():
    assert PYPROJECT["license"] == "Apache-2.0 OR MIT"
    assert sorted(PYPROJECT["license-files"]) == ["LICENSE-APACHE", "LICENSE-MIT"]
    apache = (ROOT / "LICENSE-APACHE").read_text()
    assert apache.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in apache
    assert "END OF TERMS AND CONDITIONS" in apache
    mit = (ROOT / "LICENSE-MIT").read_text()
    assert mit.startswith("MIT License") and "Permission is hereby granted, free of charge" in mit
    assert "Apache-2.0 OR MIT" in (ROOT / "README.md").read_text()


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
    assert "License-Expression: Apache-2.0 OR MIT" in meta
    assert "License-File: LICENSE-APACHE" in meta and "License-File: LICENSE-MIT" in meta
    assert "Requires-Dist: wgpu<0.33,>=0.27" in meta
    assert any(n.endswith("licenses/LICENSE-APACHE") for n in names)
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
