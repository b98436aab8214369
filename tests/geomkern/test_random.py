"""geomkern._random: the one generator rule of fedmc, ggeur and privacy (a generator's numbers are
drawn on its own device and moved to the data's; None is a fresh secret one on the data's device)."""
from __future__ import annotations

import math

import pytest
import torch

from geomkern import _random, fedmc, ggeur, privacy


def _G(seed: int, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def test_randn_draws_on_the_generators_device_and_moves(seed):
    want = torch.randn(4, 3, generator=_G(seed), dtype=torch.float64)
    got = _random.randn((4, 3), _G(seed), dtype=torch.float64, device="cpu")
    assert torch.equal(got, want)
    kept = _random.randn((4, 3), _G(seed), dtype=torch.float32)  # no device: the generator's
    assert kept.device.type == "cpu" and kept.dtype == torch.float32


def test_seed_is_drawn_from_the_generator_or_secret(seed):
    a, b = _random.seed(_G(seed)), _random.seed(_G(seed))
    assert a == b and 0 <= a < 2 ** 62
    assert int(torch.randint(0, 2 ** 62, (1,), generator=_G(seed))) == a
    secret = {_random.seed(None) for _ in range(4)}
    assert len(secret) == 4 and all(0 <= s < 2 ** 62 for s in secret)


def test_resolve_type_checks_and_makes_none_on_the_data_device():
    g = _G(0)
    assert _random.resolve(g, "cpu") is g
    fresh = _random.resolve(None, "cpu")
    assert isinstance(fresh, torch.Generator) and fresh.device.type == "cpu"
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None, got int"):
        _random.resolve(0, "cpu")
    with pytest.raises(TypeError, match="generator must be a torch.Generator or None"):
        _random.seed("0")


def test_every_module_draws_through_the_rule(seed):
    """Same seed, same numbers, whichever module draws: ggeur's eps, privacy's noise and fedmc's
    kernel-PC perturbation all come from _random.randn on the generator's device."""
    v = torch.zeros(50, 3, dtype=torch.float64)
    noise = privacy.gaussian_mechanism(v, sensitivity=1.0, noise_multiplier=2.0, generator=_G(seed))
    assert torch.equal(noise, torch.randn(50, 3, generator=_G(seed), dtype=torch.float64) * 2.0)
    X = torch.randn(40, 3, generator=_G(1), dtype=torch.float64)
    y = torch.arange(40) % 2
    geo = ggeur.aggregate([ggeur.local_statistics(X, y, 2)])
    new, _ = ggeur.augment(X, y, geo, n_per_sample=1, generator=_G(seed))
    again, _ = ggeur.augment(X, y, geo, n_per_sample=1, generator=_G(seed))
    assert torch.equal(new, again)
    s = fedmc.setup([X], generators=[_G(2)], n_prototypes=6, n_base=6, n_clusters=2, n_components=2,
                    n_entries=2, epsilon=math.inf)
    T, _ = fedmc.targets(X[:5], s.dictionary, s.basis, generator=_G(seed))
    T2, _ = fedmc.targets(X[:5], s.dictionary, s.basis, generator=_G(seed))
    assert torch.equal(T, T2)


@pytest.mark.gpu
def test_any_generator_device_with_any_data_device(seed):
    """A CPU generator draws the same numbers for CUDA data (ggeur used to refuse it), and a CUDA
    generator serves CPU data; results always land on the data's device."""
    v = torch.zeros(1000, dtype=torch.float64)
    on_cpu = privacy.gaussian_mechanism(v, sensitivity=1.0, noise_multiplier=1.0, generator=_G(seed))
    on_gpu = privacy.gaussian_mechanism(v.cuda(), sensitivity=1.0, noise_multiplier=1.0, generator=_G(seed))
    assert on_gpu.is_cuda and torch.equal(on_gpu.cpu(), on_cpu)
    back = privacy.gaussian_mechanism(v, sensitivity=1.0, noise_multiplier=1.0, generator=_G(seed, "cuda"))
    want = torch.randn(1000, generator=_G(seed, "cuda"), device="cuda", dtype=torch.float64).cpu()
    assert back.device.type == "cpu" and torch.equal(back, want)
    X = torch.randn(60, 4, generator=_G(1), dtype=torch.float64)
    y = torch.arange(60) % 3
    geo = ggeur.aggregate([ggeur.local_statistics(X, y, 3)])
    a, _ = ggeur.augment(X, y, geo, n_per_sample=2, generator=_G(seed))
    b, _ = ggeur.augment(X.cuda(), y.cuda(), geo.to("cuda"), n_per_sample=2, generator=_G(seed))
    assert b.is_cuda
    torch.testing.assert_close(b.cpu(), a, rtol=1e-12, atol=1e-12)  # same eps; GEMM rounding only
