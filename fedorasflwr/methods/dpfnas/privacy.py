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

Each mechanism's account is its *history*: (noise multiplier, sample rate, steps)
segments as the steps were taken (``add_steps``), never today's settings, so a
strategy resumed with other noise or rates (from Python; the runner refuses such a
resume) composes each step at the values it had.  ``Accountant`` caches: with ``rdp``
the RDP of one step of each (noise, rate) is computed once and scaled by the steps (RDP
composes additively, exactly as opacus's ``RDPAccountant`` sums it), so a later
iteration costs little; the first step of each new (noise, rate) costs what opacus
costs, and ``prv`` composes each new history in full.  Every history's epsilon is
remembered, so the target's look-ahead and parties alike in rates and steps cost
nothing more (``benchmarks/dpfnas_accounting.py`` measures it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...progress import root_logger_kept

with root_logger_kept():  # opacus's import adds a root handler: every flwr line twice
    from opacus.accountants import GaussianAccountant, PRVAccountant, RDPAccountant
    from opacus.accountants.analysis import gdp as gdp_analysis
    from opacus.accountants.analysis import rdp as rdp_analysis

__all__ = [
    "Accountant",
    "MechanismPrivacy",
    "PartyPrivacy",
    "Segment",
    "add_steps",
    "epsilon",
    "gdp_mu",
    "history_mu",
]

#: (noise multiplier, sample rate, steps) of consecutive steps with the same noise and rate
Segment = tuple[float, float, int]

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


def add_steps(
    history: Sequence[Segment], noise: float, rate: float, steps: int = 1
) -> list[Segment]:
    """``history`` after ``steps`` more steps at ``noise`` and ``rate`` (merged into the last
    segment when it has the same noise and rate, as opacus's accountants do)."""
    result = [(float(n), float(r), int(k)) for n, r, k in history]
    if steps <= 0:
        return result
    if result and result[-1][:2] == (float(noise), float(rate)):
        result[-1] = (result[-1][0], result[-1][1], result[-1][2] + steps)
    else:
        result.append((float(noise), float(rate), int(steps)))
    return result


def _used(history: Sequence[Segment]) -> tuple[Segment, ...]:
    """The segments that spend privacy (steps and rate > 0), the rate capped at 1."""
    return tuple((float(n), min(float(r), 1.0), int(k)) for n, r, k in history if k > 0 and r > 0)


def history_mu(history: Sequence[Segment]) -> float:
    """mu-GDP of a history: mu-GDP mechanisms compose as sqrt(sum mu_i^2) (Dong et al.);
    one segment: ``gdp_mu`` of it."""
    mus = [gdp_mu(n, r, k) for n, r, k in _used(history)]
    if not mus:
        return 0.0
    if len(mus) == 1 or any(math.isinf(m) for m in mus):
        return max(mus)
    return math.sqrt(sum(m * m for m in mus))


class Accountant:
    """epsilon at ``delta`` of (noise, rate, steps) histories, composed from cached pieces.

    Equal to a fresh opacus accountant of ``accountant`` given the same history (``rdp``:
    bit for bit, the same sum of the same per-order RDP; ``prv``: the same call;
    ``gdp``: opacus's Poisson mu-GDP conversion, of the composed mu when the history has
    several segments).  What it has computed it remembers (``size`` histories at most)."""

    def __init__(self, accountant: str, delta: float, size: int = 65536) -> None:
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"accountant {accountant!r}: allowed: {', '.join(ACCOUNTANTS)}")
        self.accountant, self.delta, self.size = accountant, delta, size
        self._rdp: dict[tuple[float, float], np.ndarray] = {}
        self._epsilon: dict[tuple[Segment, ...], float] = {}
        self.computed = 0  # histories composed (the rest came from the memory)

    def epsilon(self, history: Sequence[Segment]) -> float:
        """epsilon of ``history`` (0 without steps, inf with a step without noise)."""
        used = _used(history)
        if not used:
            return 0.0
        if any(n <= 0 for n, _, _ in used):
            return math.inf
        known = self._epsilon.get(used)
        if known is not None:
            return known
        self.computed += 1
        value = self._compose(used)
        if len(self._epsilon) >= self.size:
            self._epsilon.pop(next(iter(self._epsilon)))
        self._epsilon[used] = value
        return value

    def _compose(self, used: tuple[Segment, ...]) -> float:
        if self.accountant == "rdp":
            orders = RDPAccountant.DEFAULT_ALPHAS
            rdp = sum([self._one_step(n, r, orders) * k for n, r, k in used])
            eps, _ = rdp_analysis.get_privacy_spent(orders=orders, rdp=rdp, delta=self.delta)
            return float(eps)
        if self.accountant == "gdp":
            if len(used) == 1:
                n, r, k = used[0]
                return float(
                    gdp_analysis.compute_eps_poisson(
                        steps=k, noise_multiplier=n, sample_rate=r, delta=self.delta
                    )
                )
            mu = math.sqrt(
                sum(
                    float(
                        gdp_analysis.compute_mu_poisson(steps=k, noise_multiplier=n, sample_rate=r)
                    )
                    ** 2
                    for n, r, k in used
                )
            )
            return float(gdp_analysis.eps_from_mu(mu=mu, delta=self.delta))
        account = PRVAccountant()
        account.history = list(used)
        return float(account.get_epsilon(delta=self.delta))

    def _one_step(self, noise: float, rate: float, orders: list[float]) -> np.ndarray:
        """The per-order RDP of one step (opacus's ``compute_rdp`` with ``steps=1``)."""
        vector = self._rdp.get((noise, rate))
        if vector is None:
            vector = rdp_analysis.compute_rdp(
                q=rate, noise_multiplier=noise, steps=1, orders=orders
            )
            self._rdp[(noise, rate)] = vector
        return vector


@dataclass(frozen=True)
class MechanismPrivacy:
    """One mechanism of one party: its parameters (the latest step's noise and rate, all
    steps), guarantees so far and ``history``, the (noise, rate, steps) segments composed."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    mu: float
    epsilon: float
    history: tuple[Segment, ...] = ()

    @classmethod
    def of(
        cls, history: Sequence[Segment], account: Accountant, noise: float, rate: float
    ) -> MechanismPrivacy:
        """The guarantees of ``history`` (``noise`` and ``rate``: reported without steps)."""
        history = tuple((float(n), float(r), int(k)) for n, r, k in history)
        if history:
            noise, rate = history[-1][0], history[-1][1]
        return cls(
            noise,
            rate,
            sum(k for _, _, k in history),
            history_mu(history),
            account.epsilon(history),
            history,
        )


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
    def of(
        cls,
        partition_id: int,
        *,
        weights: Sequence[Segment],
        arch: Sequence[Segment],
        account: Accountant,
        current: tuple[float, float, float, float],
    ) -> PartyPrivacy:
        """Both mechanisms from their histories (``current``: sigma, tau, training and
        validation rates, reported for a mechanism without steps yet)."""
        sigma, tau, rate_train, rate_val = current
        return cls(
            partition_id,
            MechanismPrivacy.of(weights, account, sigma, rate_train),
            MechanismPrivacy.of(arch, account, tau, rate_val),
        )

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
        """Uncached, from one (noise, rate, steps) per mechanism (the reference of ``of``)."""

        def mechanism(noise: float, rate: float, steps: int) -> MechanismPrivacy:
            return MechanismPrivacy(
                noise,
                rate,
                steps,
                gdp_mu(noise, rate, steps),
                epsilon(noise, rate, steps, delta, accountant),
                ((noise, rate, steps),) if steps > 0 else (),
            )

        return cls(
            partition_id,
            mechanism(sigma, rate_train, steps_weights),
            mechanism(tau, rate_val, steps_arch),
        )
