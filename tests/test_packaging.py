"""Packaging: `pip install geomkern` is the kernels and the FL math only; the simulator's packages
(and the test oracles) are extras, and the fedsim command says which extra it needs."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FEDSIM_ONLY = ("matplotlib", "sklearn", "scipy", "tqdm", "PIL")
DISTRIBUTIONS = {"matplotlib", "scikit-learn", "scipy", "tqdm", "pillow"}


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


def _loaded_after(imports: str, baseline: str = "import torch, numpy, safetensors") -> list[str]:
    """Top-level packages among FEDSIM_ONLY that ``imports`` loads beyond what the core
    dependencies in ``baseline`` load by themselves (torch.hub imports tqdm whenever it is
    installed, dp-accounting's PLD accountant imports scipy)."""
    code = f"""
import sys
names = {FEDSIM_ONLY!r}
def loaded():
    return {{m.split('.')[0] for m in sys.modules if m.split('.')[0] in names}}
{baseline}
before = loaded()
{imports}
print(sorted(loaded() - before))
"""
    res = _python(code)
    assert res.returncode == 0, res.stderr
    return eval(res.stdout.strip().splitlines()[-1])


def test_import_geomkern_loads_no_fedsim_package():
    assert _loaded_after("import geomkern") == []


def test_fl_modules_load_only_the_accountants_scipy():
    baseline = "import torch, numpy, safetensors, dp_accounting.pld"
    assert _loaded_after("from geomkern import fedmc, ggeur, privacy", baseline) == []


def test_geomkern_works_without_the_fedsim_packages():
    """Hide the five packages (as in an install without extras) and run an op."""
    code = f"""
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {FEDSIM_ONLY!r}:
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Hide())
import torch, geomkern as gk
print(float(gk.rbf_gram(torch.ones(3, 2), gamma=1.0).sum()))
"""
    res = _python(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "9.0"


def test_pyproject_core_dependencies_hold_no_fedsim_package():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs):
        return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in reqs}

    core = names(project["dependencies"])
    extras = project["optional-dependencies"]
    assert not core & DISTRIBUTIONS, core & DISTRIBUTIONS
    assert {"torch", "numpy", "safetensors", "dp-accounting"} <= core
    assert {"matplotlib", "pillow", "scikit-learn", "tqdm"} <= names(extras["fedsim"])
    assert "geomkern" in names(extras["test"]) and "geomkern[fedsim]" in extras["test"]
    # the flower extra (issue 17) is the one that fedsim/flower needs: Flower with its Ray simulation
    assert "flwr[simulation]>=1.41" in extras["flower"] and "geomkern[fedsim]" in extras["flower"]


def test_fedsim_cli_without_its_extra_says_which_extra_in_one_line():
    res = _python("import sys\nsys.modules['matplotlib'] = None\nfrom fedsim.cli import main\n"
                  "sys.exit(main(['run', '--rounds', '1']))")
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'geomkern[fedsim]'" in lines[0], res.stderr
    assert "matplotlib" in lines[0]
