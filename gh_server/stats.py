"""The statistics results report, as pure functions (tested against published worked examples).

- `wilson`: the Wilson score interval of a proportion (Wilson 1927; Newcombe 1998, method 3).
- `pass_at_k` / `pass_hat_k`: the unbiased estimators of "at least one of k tries passes" (Chen et al.
  2021, the Codex paper) and "all k tries pass" (Yao et al. 2024, tau-bench), from n scored tries of
  which c passed, averaged over cases.
- `mcnemar_exact`: the exact conditional (binomial) McNemar test on the discordant pairs, two-sided,
  with its mid-p (Fagerland, Lydersen & Laake 2013).
- `paired_bootstrap`: a percentile interval of the mean of paired differences, resampling cases with a
  fixed seed so that the same results always give the same interval (its normal limit past 40 cases).
- `cohen_kappa`: Cohen's kappa of a 2x2 agreement table with the large-sample standard error of Fleiss,
  Cohen & Everitt (1969) and its Wald interval.

Stdlib only: these are small sums, and a numeric dependency would not earn its place.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054  # the 0.975 quantile of the standard normal
BOOTSTRAP_REPS = 2000
BOOTSTRAP_SEED = 16
BOOTSTRAP_MAX_CASES = 40
EXACT_INTEGERS_UP_TO = 200  # McNemar's discordant pairs summed as integers; beyond, in log space


def wilson(passed: float, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of passed/n; None without a try."""
    if n <= 0:
        return None
    p = passed / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, centre - half), min(1.0, centre + half)


def score_interval(scores: Sequence[float], z: float = Z95) -> tuple[float, float] | None:
    """A 95% interval of the mean of scores in [0, 1]: Wilson's interval with their sum as the passes.
    A variable in [0, 1] with mean p has variance at most p(1 - p), the Bernoulli's, so this is at least as
    wide as it needs to be; it is Wilson's exactly when every score is 0 or 1 (the pass rate's interval),
    and it stays inside [0, 1] and away from a zero width at n = 1, as a t interval does not."""
    if not scores:
        return None
    return wilson(sum(scores), len(scores), z)


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k tries drawn from the n passes), c of the n having passed: 1 - C(n-c,k)/C(n,k)."""
    if not 0 < k <= n:
        raise ValueError(f"k must be in 1..{n}, not {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """P(all k tries drawn from the n pass): C(c,k)/C(n,k)."""
    if not 0 < k <= n:
        raise ValueError(f"k must be in 1..{n}, not {k}")
    return math.comb(c, k) / math.comb(n, k)


def pass_curves(per_case: Sequence[tuple[int, int]]) -> tuple[dict[str, float], dict[str, float]]:
    """pass@k and pass^k averaged over cases, for k from 1 to the most scored tries of any case; a case
    counts for k when it has at least k scored tries. `per_case` is (scored tries, passed) per case."""
    top = max((n for n, _ in per_case), default=0)
    counts = Counter(per_case)  # cases repeat the same few (tries, passed) pairs: each is computed once
    at: dict[str, float] = {}
    hat: dict[str, float] = {}
    for k in range(1, top + 1):
        cases = [(nc, w) for nc, w in counts.items() if nc[0] >= k]
        total = sum(w for _, w in cases)
        at[str(k)] = round(sum(w * pass_at_k(n, c, k) for (n, c), w in cases) / total, 4)
        hat[str(k)] = round(sum(w * pass_hat_k(n, c, k) for (n, c), w in cases) / total, 4)
    return at, hat


@dataclass(frozen=True)
class McNemar:
    b: int  # pairs where only the first passed
    c: int  # pairs where only the second passed
    p_value: float  # exact conditional, two-sided
    mid_p: float


def mcnemar_exact(b: int, c: int) -> McNemar:
    """Under H0 the discordant pairs split 50:50: p = 2 * P(X <= min(b, c)), X ~ Bin(b + c, 1/2), capped at 1."""
    n = b + c
    if n == 0:
        return McNemar(b, c, 1.0, 1.0)
    m = min(b, c)
    if n <= EXACT_INTEGERS_UP_TO:
        tail = sum(math.comb(n, i) for i in range(m + 1)) / 2**n
        point = math.comb(n, m) / 2**n
    else:  # the same sum in log space: integers of thousands of bits cost results tens of milliseconds
        logs = [_log_half_binom(n, i) for i in range(m + 1)]
        top = max(logs)
        tail = math.exp(top) * sum(math.exp(x - top) for x in logs)
        point = math.exp(logs[-1])
    return McNemar(b, c, min(1.0, 2 * tail), min(1.0, 2 * (tail - point / 2)))


def _log_half_binom(n: int, i: int) -> float:
    """log(C(n, i) / 2^n)."""
    return math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2)


def paired_bootstrap(diffs: Sequence[float], reps: int = BOOTSTRAP_REPS, seed: int = BOOTSTRAP_SEED,
                     level: float = 0.95, max_cases: int = BOOTSTRAP_MAX_CASES) -> tuple[float, float] | None:
    """A percentile interval of mean(diffs), resampling the pairs (cases) with replacement. Beyond
    `max_cases` pairs, the interval the percentile bootstrap converges to (mean +- z * sd / sqrt(n) with
    the plug-in sd): resampling hundreds of cases thousands of times costs results a second per request,
    and at that size the two agree to the third decimal."""
    if not diffs:
        return None
    n = len(diffs)
    if n > max_cases:
        mean = sum(diffs) / n
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / n)
        z = Z95 if level == 0.95 else statistics.NormalDist().inv_cdf((1 + level) / 2)
        return mean - z * sd / math.sqrt(n), mean + z * sd / math.sqrt(n)
    rng = random.Random(seed)
    pool = list(diffs)
    means = sorted(sum(rng.choices(pool, k=n)) / n for _ in range(reps))  # choices: the loop in C
    lo = means[math.floor((1 - level) / 2 * reps)]
    hi = means[min(reps - 1, math.ceil((1 + level) / 2 * reps) - 1)]
    return lo, hi


@dataclass(frozen=True)
class Kappa:
    kappa: float | None
    se: float | None
    low: float | None
    high: float | None


def cohen_kappa(both_yes: int, first_yes_only: int, second_yes_only: int, both_no: int, z: float = Z95) -> Kappa:
    """Cohen's kappa of two raters on yes/no items, with the Fleiss-Cohen-Everitt (1969) standard error.
    None when it is undefined (no items, or chance agreement is already total)."""
    n = both_yes + first_yes_only + second_yes_only + both_no
    if n == 0:
        return Kappa(None, None, None, None)
    p = [[both_yes / n, first_yes_only / n], [second_yes_only / n, both_no / n]]
    rows = [p[0][0] + p[0][1], p[1][0] + p[1][1]]
    cols = [p[0][0] + p[1][0], p[0][1] + p[1][1]]
    po = p[0][0] + p[1][1]
    pe = rows[0] * cols[0] + rows[1] * cols[1]
    if pe >= 1.0:
        return Kappa(None, None, None, None)
    k = (po - pe) / (1 - pe)
    diag = sum(p[i][i] * (1 - (rows[i] + cols[i]) * (1 - k)) ** 2 for i in range(2))
    off = (1 - k) ** 2 * sum(p[i][j] * (cols[i] + rows[j]) ** 2 for i in range(2) for j in range(2) if i != j)
    var = max(0.0, (diag + off - (k - pe * (1 - k)) ** 2) / (n * (1 - pe) ** 2))
    se = math.sqrt(var)
    return Kappa(k, se, max(-1.0, k - z * se), min(1.0, k + z * se))
