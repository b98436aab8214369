"""The test suite's seeds (tests/conftest.py): fixed per test by default, so CI is reproducible;
fresh with --random-seeds (make test-random); --seed replays one."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# two cases of one parametrized test that takes the `seed` fixture: the probe below, which does
# nothing else, so the four child runs cost their start-up only (a K-Means test took 60 s of them)
CASES = "tests/test_seeds.py::test_probe"


@pytest.mark.parametrize("case", ("a", "b"))
def test_probe(case, seed):
    assert 0 <= seed < 2 ** 32


def _seeds(*args: str) -> dict[str, int]:
    proc = subprocess.run([sys.executable, "-m", "pytest", CASES, "-q", "-s", "-p", "no:cacheprovider",
                           *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    found = dict(re.findall(r"\[geomkern tests\] (\S+): seed=(\d+)", proc.stdout))
    assert len(found) >= 2, proc.stdout[-3000:]
    return {k: int(v) for k, v in found.items()}


@pytest.mark.early
def test_default_seeds_are_fixed_per_case_and_random_seeds_are_not():
    a, b = _seeds(), _seeds()
    assert a == b, "make test's seeds changed between two runs"
    assert len(set(a.values())) == len(a), "two parametrized cases share a seed"
    r = _seeds("--random-seeds")
    assert r.keys() == a.keys() and r != a, "--random-seeds drew the fixed seeds"
    one = _seeds("--seed", "12345")
    assert set(one.values()) == {12345}
