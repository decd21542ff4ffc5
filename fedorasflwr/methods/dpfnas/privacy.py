"""Privacy accounting of DP-FNAS, per party and per mechanism (Theorem 3.1).

Each party k runs two subsampled Gaussian mechanisms on disjoint data: M^G on
its training split (noise multiplier sigma, sample rate p_k = B / N_k^tr) and
M^H on its validation split (tau, B / N_k^val).  Because the splits are
disjoint the two compose separately over the T iterations (paper, App. A).

Reported for each: the paper's mu-GDP, ``mu = p sqrt(T (e^{1/sigma^2} - 1))``
(Bu et al., 2019, a CLT approximation), and (epsilon, delta) from an opacus
accountant (``rdp`` by default; ``prv``; ``gdp`` converts the paper's mu).
A party is (epsilon, delta)-DP for each of its two datasets; an individual is
in only one of them, so the party's epsilon is the larger of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from opacus.accountants import GaussianAccountant, PRVAccountant, RDPAccountant

__all__ = ["MechanismPrivacy", "PartyPrivacy", "composed_epsilon", "epsilon", "gdp_mu"]

ACCOUNTANTS = {"rdp": RDPAccountant, "prv": PRVAccountant, "gdp": GaussianAccountant}


def gdp_mu(noise_multiplier: float, sample_rate: float, steps: int) -> float:
    """Theorem 3.1: ``p sqrt(T (exp(1 / sigma^2) - 1))``; inf without noise, 0 without steps."""
    if steps == 0 or sample_rate == 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    exponent = 1.0 / noise_multiplier**2
    if exponent > 700:  # e^{1/sigma^2} overflows: as good as no privacy
        return math.inf
    return sample_rate * math.sqrt(steps * math.expm1(exponent))


def epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str = "rdp"
) -> float:
    """epsilon at ``delta`` of ``steps`` Poisson-subsampled Gaussian mechanisms (opacus)."""
    if steps == 0 or sample_rate == 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    account = ACCOUNTANTS[accountant]()
    account.history = [(noise_multiplier, min(sample_rate, 1.0), steps)]
    return float(account.get_epsilon(delta=delta))


def composed_epsilon(
    mechanisms: list[tuple[float, float, int]], delta: float, accountant: str = "rdp"
) -> float:
    """epsilon at ``delta`` of several (noise multiplier, sample rate, steps) runs on one dataset.

    Used when the final training (DP-SGD) reuses the training split the W mechanism saw.
    """
    used = [(n, min(r, 1.0), s) for n, r, s in mechanisms if s > 0 and r > 0]
    if not used:
        return 0.0
    if any(n <= 0 for n, _, _ in used):
        return math.inf
    if len(used) == 1:
        return epsilon(*used[0], delta, accountant)
    account = ACCOUNTANTS["prv" if accountant == "prv" else "rdp"]()
    account.history = used
    return float(account.get_epsilon(delta=delta))


@dataclass(frozen=True)
class MechanismPrivacy:
    """One mechanism of one party: its parameters and guarantees so far."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    mu: float
    epsilon: float


@dataclass(frozen=True)
class PartyPrivacy:
    """Both mechanisms of one party (W on the training split, A on the validation split)."""

    partition_id: int
    weights: MechanismPrivacy
    architecture: MechanismPrivacy

    @property
    def epsilon(self) -> float:
        return max(self.weights.epsilon, self.architecture.epsilon)

    @classmethod
    def compute(
        cls,
        partition_id: int,
        *,
        sigma: float,
        tau: float,
        rate_train: float,
        rate_val: float,
        steps_weights: int,
        steps_arch: int,
        delta: float,
        accountant: str,
    ) -> PartyPrivacy:
        def mechanism(noise: float, rate: float, steps: int) -> MechanismPrivacy:
            return MechanismPrivacy(
                noise,
                rate,
                steps,
                gdp_mu(noise, rate, steps),
                epsilon(noise, rate, steps, delta, accountant),
            )

        return cls(
            partition_id,
            mechanism(sigma, rate_train, steps_weights),
            mechanism(tau, rate_val, steps_arch),
        )
