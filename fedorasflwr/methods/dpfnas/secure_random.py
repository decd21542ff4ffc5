"""The DP randomness of a party: drawn from the OS CSPRNG, so the server cannot regenerate it.

Why
---
DP-FNAS protects a party's data against the *server*, which sees every noised
gradient.  If the Gaussian noise (or the Poisson sample) came from a generator
seeded with numbers the server knows - the run seed, the round, the partition
id - the server could regenerate the noise, subtract it and recover the clipped
gradient sum exactly (measured: to 1.9e-9): every reported epsilon would be
void against it.

What the server can and cannot reproduce
----------------------------------------
:class:`SecureRandom` reads every bit it uses from the operating system's
CSPRNG (``os.urandom``: ``getrandom(2)`` on Linux), the source opacus'
``secure_mode`` reads through torchcsprng's ``/dev/urandom`` generator
(torchcsprng is not installable here).  There is no seed: nothing the server
knows or sends - seed, round, partition id, weights - determines a draw, and
the OS CSPRNG's output cannot be predicted from any other output, so even a
server that learnt some draws (say, of an earlier round) learns nothing about
the next.  The server can still reproduce everything that is *public*: the
clip norms, the noise multipliers, the sample rate p and the expected batch
p N (the divisor), i.e. exactly the quantities the accountant assumes public.
That is enough: the Gaussian mechanism's guarantee (and the subsampling
amplification the accountant uses) needs only that the noise and the sample
are independent of everything the adversary knows, which they are.

Floating point
--------------
A float Gaussian sampler cannot reach every float, and which floats a noised
value can take leaks the value underneath (Mironov 2012; Jin et al. 2021,
arXiv:2107.10138).  As opacus' secure mode (``optimizers/optimizer.py``,
``_generate_noise``), each noise coordinate is the sum of four draws of
N(0, std^2) halved - still N(0, std^2), but with an attack cost of 2^(p (2n-1))
for n = 2 (section 5.1 of that paper) - and the draws are made in float64
before rounding to the gradient's dtype.

Reproducible noise
------------------
Only the run-config key ``dpfnas.insecure-reproducible-noise = true`` makes a
party use seeded generators instead (:func:`party_randomness`); the run then
gives no privacy against the server, which the server log and ``result.json``
say.  Without noise (modes ``fnas``, ``single``) nothing is private and the
seeded generators keep such runs reproducible.  Like the noise multiplier, the
flag reaches the party in the server's message: a party that does not trust the
server to follow the protocol must pin both itself.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...seeding import numpy_generator, torch_generator
from .contract import INSECURE_KEY

__all__ = [
    "NoiseSource",
    "SampleSource",
    "SecureRandom",
    "gaussian",
    "party_randomness",
]

_DRAWS = 4  # opacus' secure mode: 2n draws with n = 2, summed and halved
_UNIT = 2.0**-53


class SecureRandom:
    """Uniforms and Gaussians from the OS CSPRNG (``os.urandom``); no seed, no state.

    ``random`` has the signature of ``numpy.random.Generator.random`` so it can
    drive :func:`~fedorasflwr.methods.dpfnas.client.poisson_sample`.
    """

    def random(self, size: int) -> np.ndarray:
        """``size`` uniforms in [0, 1), each from 53 fresh bits of the OS CSPRNG."""
        words = np.frombuffer(os.urandom(8 * size), dtype=np.uint64)
        return (words >> np.uint64(11)).astype(np.float64) * _UNIT

    def standard_normal(self, count: int) -> np.ndarray:
        """``count`` float64 N(0, 1) draws (Box-Muller on CSPRNG uniforms)."""
        pairs = -(-count // 2)
        radius = np.sqrt(-2.0 * np.log1p(-self.random(pairs)))  # log(1 - u), 1 - u in (0, 1]
        angle = 2.0 * math.pi * self.random(pairs)
        return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]

    def normal(
        self,
        std: float,
        shape: Sequence[int],
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> Tensor:
        """N(0, std^2) of ``shape`` on ``device``: four CSPRNG draws summed and halved
        (opacus secure mode), made in float64 on the host, rounded to ``dtype`` there."""
        count = math.prod(shape)
        total = np.zeros(count)
        for _ in range(_DRAWS):
            total += self.standard_normal(count)
        scale = std / math.sqrt(_DRAWS)
        noise = torch.from_numpy(total * scale).reshape(tuple(shape)).to(dtype)
        return noise.to(device)


NoiseSource = torch.Generator | SecureRandom
"""Where Gaussian noise comes from: a seeded generator (reproducible) or the OS CSPRNG."""
SampleSource = np.random.Generator | SecureRandom
"""Where Poisson-sampling uniforms come from (both have ``.random(size)``)."""


def gaussian(
    std: float,
    shape: Sequence[int],
    source: NoiseSource,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> Tensor:
    """N(0, std^2) noise of ``shape`` from ``source``, on ``device`` (the gradient's).

    A seeded ``torch.Generator`` draws on its own device (the CPU, for
    :func:`party_randomness`'s: the same seed then gives the same noise whatever
    device trains) and the draw is moved to ``device``; the OS CSPRNG draws on the host."""
    if isinstance(source, SecureRandom):
        return source.normal(std, shape, dtype, device)
    draw = torch.normal(0.0, std, tuple(shape), generator=source, device=source.device)
    return draw.to(device=device, dtype=dtype)


def party_randomness(
    config: Mapping[str, Any], words: Sequence[int], private: bool
) -> tuple[SampleSource, NoiseSource]:
    """The sampling and noise sources of one private computation of a party.

    Parameters
    ----------
    config : Mapping
        The message config; ``insecure-reproducible-noise`` (default false) asks
        for seeded sources.
    words : sequence of int
        Seed words (seed, round, partition id, ...): used only by seeded sources.
    private : bool
        Whether the computation is a DP mechanism (noise multiplier > 0).

    Returns
    -------
    (SampleSource, NoiseSource)
        The OS CSPRNG for both when ``private`` and the insecure flag is off;
        else a ``numpy`` and a ``torch`` generator fixed by ``words``.
    """
    if private and not bool(config.get(INSECURE_KEY, False)):
        source = SecureRandom()
        return source, source
    return numpy_generator(words), torch_generator(words)
