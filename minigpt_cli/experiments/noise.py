"""Seed noise: whether two variants' difference of means exceeds it (Welch's t-test), and the seeds
per variant that would bring a difference within it to p < :data:`ALPHA` (its power)."""

from __future__ import annotations

import math
import statistics

#: What :func:`seeds_needed` plans for: a two-sided test at this level, with this power.
ALPHA, POWER = 0.05, 0.8


def seeds_needed(
    effect: float, variance_ratio: float = 1.0, alpha: float = ALPHA, power: float = POWER
) -> int:
    """Seeds per variant for Welch's two-sided t-test at level ``alpha`` to detect, with ``power``,
    a difference of ``effect`` root-mean-square standard deviations (d = |m1 - m2| / sqrt((s1² +
    s2²) / 2), > 0) between variants whose variances stand in ``variance_ratio`` (s1² / s2²): the
    smallest n >= 2 whose power, from the noncentral t distribution with noncentrality d·sqrt(n/2)
    and Welch-Satterthwaite's (n - 1)(1 + r)² / (1 + r²) degrees of freedom, reaches ``power``. With
    equal variances this is Student's test, as Cohen (1988, *Statistical Power Analysis*, table
    2.4.1), statsmodels' ``TTestIndPower`` and G*Power compute it."""
    from scipy import stats

    # Welch-Satterthwaite's degrees of freedom with n seeds a side, by variance share a = s1² / (s1²
    # + s2²).
    a = 1.0 if math.isinf(variance_ratio) else variance_ratio / (1 + variance_ratio)

    def reached(n: int) -> bool:
        df = (n - 1) / (a**2 + (1 - a) ** 2)
        t, ncp = stats.t.ppf(1 - alpha / 2, df), effect * math.sqrt(n / 2)
        return stats.nct.sf(t, df, ncp) + stats.nct.cdf(-t, df, ncp) >= power

    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    # The normal approximation, which the t-test's n never undercuts; past 100,000 the two agree.
    n = max(2, math.floor(2 * (z / effect) ** 2))
    while n < 100_000 and not reached(n):
        n += 1
    return n


def verdicts(rows: list[dict], stat: str) -> tuple[list[str], list[dict]]:
    """One sentence per pair of variants (each against the best when there are more than five), and
    the pair's numbers: the difference of means, Welch's p-value and, while p is not below
    :data:`ALPHA`, the seeds per variant that would bring it there (:func:`seeds_needed`; None with
    one seed a side). The verdict is the t-test's alone. ``rows``: a summary's, each with its
    ``variant``, the mean ``stat`` and ``<stat>_all``, its seeds' values."""
    from scipy import stats

    unit = "nats" if stat == "final_val" else "bits per byte"
    have = [r for r in rows if r.get(stat) is not None]
    if len(have) > 5:
        best = min(have, key=lambda r: r[stat])
        pairs = [(best, r) for r in have if r is not best]
    else:
        pairs = [(a, b) for i, a in enumerate(have) for b in have[i + 1 :]]
    sentences, numbers = [], []
    for a, b in pairs:
        xa, xb = a[f"{stat}_all"], b[f"{stat}_all"]
        diff = statistics.fmean(xa) - statistics.fmean(xb)
        lower, higher = (a, b) if diff < 0 else (b, a)
        said = f"{lower['variant']} is {abs(diff):.4f} {unit} below {higher['variant']}"
        numbers.append(
            {
                "lower": lower["variant"],
                "higher": higher["variant"],
                "difference": abs(diff),
                "p_value": None,
                "significant": None,
                "seeds_needed": None,
            }
        )
        if len(xa) < 2 or len(xb) < 2:
            sentences.append(
                f"{said}; with one seed there is no noise estimate (a p-value needs at least 2 "
                "seeds each)"
            )
            continue
        va, vb = statistics.variance(xa), statistics.variance(xb)
        if va == vb == 0:
            sentences.append(
                f"{said}; its seeds agree exactly, so there is no seed noise to test against"
            )
            continue
        p = float(stats.ttest_ind(xa, xb, equal_var=False).pvalue)
        significant = p < ALPHA
        numbers[-1].update(p_value=p, significant=significant)
        test = f"Welch's t-test p = {p:.3g}"
        if significant:
            sentences.append(f"{said}; the difference exceeds the seed noise ({test} < {ALPHA})")
            continue
        ran = max(len(xa), len(xb))
        n = None  # else at least 3: more than the 2 or more seeds run
        if diff:
            # Welch's test on the seeds run is not yet below ALPHA: more than those are needed,
            # whatever the power calculation says for seed counts that differ between the variants.
            rms = math.sqrt((va + vb) / 2)
            n = max(ran + 1, seeds_needed(abs(diff) / rms, va / vb if vb else math.inf))
        numbers[-1].update(seeds_needed=n)
        plan = (
            f"about {n} seeds per variant would resolve it at p < {ALPHA} with power {POWER}, "
            f"if the means and spreads hold"
            if n
            else "there is no difference to resolve"
        )
        sentences.append(
            f"{said}; the difference is within the seed noise ({test}, not below {ALPHA}); {plan}"
        )
    return sentences, numbers
