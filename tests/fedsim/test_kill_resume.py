"""Issue 44 item 3: a real ``fedsim run`` child process killed with SIGKILL at a random point of its
rounds, then ``fedsim run --resume``, on the paths that came after the first kill tests: ``--tune``
(its grid points are plain runs under out/tune/), FedHeNN and FLIC's personal-first schedule (the
personalised path). The resumed run's results.json must be byte-identical to an uninterrupted run's,
every checkpoint.pt must hold the same state (all but its wall-clock timings), and the kill must
leave no process of the run behind.

Kill points. The reference run (in this process) records when each checkpoint write happened; the
child is killed ``u`` x (that run's time from its first checkpoint to its last) after its own first
checkpoint appears, so a point lands in a round, in a checkpoint write, between grid points or in
FLIC's alignment phase of a late first participation; a resumed child of the chain below may also
be killed in its final outputs (plots, results.json last). ``u`` comes from the test's seed
(tests/conftest.py: fixed by default, fresh with ``--random-seeds``); a failure prints the seed.
The default run kills once per path; ``--runslow`` kills a chain: the resumed child is killed
again, three times, before the last resume. A child that finishes before its kill point is
retried at half the delay (a kill that never lands fails the test rather than passing it
unkilled)."""
from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _fedsim_helpers import save_blobs

from fedsim import _checkpoint
from fedsim.cli import main
from fedsim.flower._reaper import alive, descendants

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="follows the run's processes through /proc")

ROOT = Path(__file__).resolve().parents[2]

PERSONAL_TOML = """dataset = "toy:linear-mapping?n_spaces=3&n_train=24&n_test=30"
n_clients = 6
rounds = {rounds}
local_epochs = 1
batch_size = 16
lr = 0.01
client_fraction = 0.5
model = "personal"
[model_params]
embed_dim = 4
embed_hidden = 8
hidden = 8
"""

# path -> (its flags, or None for the personalised TOML; rounds)
PATHS = {
    "tune": (["--clients", "3", "--min-size", "5", "--algorithms", "fedavg", "--augmenters", "none",
              "--tune", "--seeds", "1"], 6),
    "fedhenn": (["--algorithms", "fedhenn", "--set", "fedhenn.optimizer=adam"], 8),
    # personal-first: phi_i and the head, then the representation from round 3; each client aligned
    # (20 steps) at its first participation, which with half the clients per round is mid-run too
    "flic-personal-first": (["--algorithms", "flic", "--set", "flic.schedule=personal-first",
                             "--set", "flic.rep_start_round=3", "--set", "flic.align_epochs=20"], 6),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("kill-inputs")
    blobs = save_blobs(d / "blobs.npz", classes=4, dim=8, noise=1.0, n_train=240, n_test=80, seed=0)
    return d, blobs


def _argv(path: str, inputs) -> list[str]:
    d, blobs = inputs
    flags, rounds = PATHS[path]
    if path == "tune":
        return ["--dataset", str(blobs), "--rounds", str(rounds), *flags]
    toml = d / f"{path}.toml"
    toml.write_text(PERSONAL_TOML.format(rounds=rounds))
    return ["--config", str(toml), *flags]


@contextlib.contextmanager
def _one_thread():
    """--threads 1 in this process as in the child (the same float summation order), then back."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _reference(argv, out: Path, monkeypatch) -> tuple[float, int]:
    """The uninterrupted run in this process: (seconds from its first checkpoint write to its last,
    checkpoint writes)."""
    real, stamps = _checkpoint.torch.save, []

    def save(obj, path):
        stamps.append(time.monotonic())
        return real(obj, path)

    monkeypatch.setattr(_checkpoint.torch, "save", save)
    with _one_thread():
        assert main(["run", *argv, "--threads", "1", "--quiet", "--out", str(out)]) == 0
    monkeypatch.setattr(_checkpoint.torch, "save", real)
    assert len(stamps) > 1, "the reference run wrote fewer than two checkpoints"
    return stamps[-1] - stamps[0], len(stamps)


def _checkpoints(out: Path) -> dict[str, tuple[int, int]]:
    """relative path -> (inode, mtime_ns) of every checkpoint.pt under ``out``."""
    found = {}
    for p in out.rglob("checkpoint.pt"):
        with contextlib.suppress(OSError):
            st = p.stat()
            found[str(p.relative_to(out))] = (st.st_ino, st.st_mtime_ns)
    return found


def _group(pgid: int) -> list[int]:
    """Live processes (not zombies) in process group ``pgid``."""
    left = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        with contextlib.suppress(OSError):
            s = Path(f"/proc/{d}/stat").read_text()
            st = s[s.rfind(")") + 2:].split()
            if int(st[2]) == pgid and st[0] not in ("Z", "X"):
                left.append(int(d))
    return left


def _kill_child(cmd: list[str], out: Path, delay: float, log: Path, lead: dict) -> str:
    """Start ``fedsim run`` as a child in its own session, SIGKILL it ``delay`` s after its first new
    checkpoint write (or, where ``lead["s"]`` is known, that long after its start if no checkpoint
    came sooner: a resumed run killed in its final outputs writes none), check that nothing it
    started is left; 'killed' or 'finished' (it ended before the kill point, exit 0). Records in
    ``lead["s"]`` the seconds from a start to the first checkpoint."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    before = _checkpoints(out) if out.exists() else {}
    with log.open("a") as f:
        proc = subprocess.Popen([sys.executable, "-m", "fedsim.cli", "run", *cmd], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=out.parent, start_new_session=True)
    t0, started = time.monotonic(), {}
    try:
        deadline, first, last_scan = time.monotonic() + 240, None, 0.0
        while proc.poll() is None and time.monotonic() < deadline:
            now = time.monotonic()
            if now - last_scan > 0.1:
                started.update(descendants(proc.pid))
                last_scan = now
            if first is None:
                if out.exists() and _checkpoints(out) != before:
                    first = now
                    lead.setdefault("s", now - t0)
                elif "s" in lead and now - t0 >= lead["s"]:
                    first = now
            elif now - first >= delay:
                break
            time.sleep(0.002)
        assert time.monotonic() < deadline, \
            f"the child neither checkpointed nor ended in 240 s: {log.read_text()[-2000:]}"
        if proc.poll() is not None:
            assert proc.returncode == 0, f"the child failed before its kill point: {log.read_text()[-3000:]}"
            return "finished"
        started.update(descendants(proc.pid))
        os.kill(proc.pid, signal.SIGKILL)  # kill -9 of the fedsim process itself, not its group
        assert proc.wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (_group(proc.pid) or any(alive(p, s) for p, s in started.items())):
            time.sleep(0.2)
        left = sorted(set(_group(proc.pid)) | {p for p, s in started.items() if alive(p, s)})
        assert not left, f"processes of the killed run left: {left}"
        return "killed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _state(path: Path) -> dict:
    """A checkpoint without its wall-clock timings (the one part a resume cannot repeat)."""
    ck = torch.load(path, weights_only=True)
    ck.pop("timings", None)
    return ck


def _same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def _check_kill_and_resume(path, inputs, tmp_path, monkeypatch, seed, kills: int):
    argv = _argv(path, inputs)
    window, writes = _reference(argv, tmp_path / "full", monkeypatch)
    rng = random.Random(seed)
    cut, log, landed, lead = tmp_path / "cut", tmp_path / "child.log", [], {}
    for k in range(kills):
        if (cut / "results.json").exists():  # killed after its last write: nothing left to resume
            break
        # within the rounds; a resumed child has less left to do, and may be killed in its outputs
        u = rng.random() if k == 0 else 1.25 * rng.random()
        cmd = (["--resume", str(cut)] if (cut / "config.json").exists()
               else [*argv, "--out", str(cut)]) + ["--threads", "1", "--quiet"]
        for attempt in range(4):
            outcome = _kill_child(cmd, cut, u * window / 2 ** attempt, log, lead)
            landed.append((round(u / 2 ** attempt, 3), outcome))
            if outcome == "killed" or k > 0:
                break
            shutil.rmtree(cut)  # the run finished unkilled: start it again, to be killed sooner
        else:
            pytest.fail(f"{path}: the child always finished before its kill point ({landed}; seed {seed})")
        if outcome == "finished":  # a later link of the chain found nothing left to kill
            break
    print(f"[kill points] {path}: {writes} checkpoint writes in {window:.2f} s; u, outcome: {landed}")
    if not (cut / "results.json").exists():
        with _one_thread():
            assert main(["run", "--resume", str(cut), "--threads", "1", "--quiet"]) == 0
    assert (cut / "results.json").read_bytes() == (tmp_path / "full" / "results.json").read_bytes(), \
        f"{path}: the resumed results.json differs (kill points {landed}, seed {seed})"
    full, resumed = sorted((tmp_path / "full").rglob("checkpoint.pt")), sorted(cut.rglob("checkpoint.pt"))
    assert [p.relative_to(tmp_path / "full") for p in full] == [p.relative_to(cut) for p in resumed]
    for a, b in zip(full, resumed):
        _same(_state(a), _state(b), str(b.relative_to(cut)))
    assert not list(cut.rglob("*.tmp"))


@pytest.mark.parametrize("path", list(PATHS))
def test_a_run_killed_at_a_random_point_resumes_byte_identically(path, inputs, tmp_path, monkeypatch, seed):
    _check_kill_and_resume(path, inputs, tmp_path, monkeypatch, seed, kills=1)


@pytest.mark.slow
@pytest.mark.parametrize("path", list(PATHS))
def test_a_run_killed_again_while_resuming_still_resumes_byte_identically(path, inputs, tmp_path, monkeypatch,
                                                                          seed):
    _check_kill_and_resume(path, inputs, tmp_path, monkeypatch, seed, kills=4)


def _reliability_row(surface: str) -> str:
    """The row of docs/reliability.md's harness table for ``surface``: its counts are this file's."""
    rows = [ln for ln in (ROOT / "docs" / "reliability.md").read_text().splitlines() if ln.startswith(f"| {surface} |")]
    assert len(rows) == 1, f"docs/reliability.md has {len(rows)} rows for {surface!r}"
    return rows[0]


def test_the_reliability_page_states_these_kill_points():
    assert f"| {len(PATHS)} kill points, one per path |" in _reliability_row("kill and resume")
