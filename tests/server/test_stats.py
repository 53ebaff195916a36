"""gh_server.stats against published worked examples; each test names its source."""

from __future__ import annotations

import math

import pytest

from gh_server import stats


@pytest.mark.parametrize(("passed", "n", "low", "high"), [
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0000, 0.1611),
    (1, 29, 0.0061, 0.1718),
])
def test_wilson_matches_newcombe_1998(passed: int, n: int, low: float, high: float) -> None:
    # Newcombe RG (1998), "Two-sided confidence intervals for the single proportion: comparison of seven
    # methods", Statistics in Medicine 17:857-872, Table II, method 3 (Wilson score, no continuity correction).
    lo, hi = stats.wilson(passed, n) or (None, None)
    assert (round(lo, 4), round(hi, 4)) == (low, high)


def test_wilson_without_tries_is_none() -> None:
    assert stats.wilson(0, 0) is None


def test_mcnemar_exact_matches_fagerland_2013() -> None:
    # Fagerland MW, Lydersen S, Laake P (2013), "The McNemar test for binary matched-pairs data: mid-p and
    # asymptotic are better than exact conditional", BMC Medical Research Methodology 13:91, the airway
    # hyper-responsiveness example (21 children; discordant pairs 1 and 7): exact conditional p = 0.070,
    # mid-p = 0.039.
    m = stats.mcnemar_exact(1, 7)
    assert round(m.p_value, 3) == 0.070 and round(m.mid_p, 3) == 0.039
    assert m.p_value == pytest.approx(18 / 256)  # 2 * (C(8,0) + C(8,1)) / 2^8
    assert stats.mcnemar_exact(7, 1) == stats.McNemar(7, 1, m.p_value, m.mid_p)  # symmetric
    assert stats.mcnemar_exact(0, 0).p_value == 1.0 and stats.mcnemar_exact(3, 3).p_value == 1.0


def test_cohen_kappa_matches_fleiss_paik_via_statpsych() -> None:
    # Fleiss JL, Paik MC (2003), Statistical Methods for Rates and Proportions, 3rd ed., Wiley: the large-sample
    # SE of Fleiss, Cohen & Everitt (1969). Worked example from Bonett's statpsych R package, ci.kappa(.05, 31,
    # 12, 4, 58) (f00=31, f01=12, f10=4, f11=58): Cohen kappa 0.6756757, SE 0.07344761, CI 0.5317210-0.8196303.
    k = stats.cohen_kappa(both_yes=58, first_yes_only=4, second_yes_only=12, both_no=31)
    assert k.kappa == pytest.approx(0.6756757, abs=1e-7)
    assert k.se == pytest.approx(0.07344761, abs=1e-8)
    assert k.low == pytest.approx(0.5317210, abs=1e-7) and k.high == pytest.approx(0.8196303, abs=1e-7)


def test_cohen_kappa_matches_the_textbook_two_by_two() -> None:
    # The 50-item yes/no example of Wikipedia's "Cohen's kappa" article: 20 both yes, 5 + 10 disagreeing,
    # 15 both no -> p_o = 0.7, p_e = 0.5, kappa = 0.4.
    assert stats.cohen_kappa(20, 5, 10, 15).kappa == pytest.approx(0.4)
    assert stats.cohen_kappa(0, 0, 0, 0).kappa is None
    assert stats.cohen_kappa(10, 0, 0, 0).kappa is None  # one category only: chance agreement is total


def test_pass_at_k_and_pass_hat_k() -> None:
    # Chen et al. (2021), "Evaluating Large Language Models Trained on Code", eq. 1: 1 - C(n-c,k)/C(n,k);
    # Yao et al. (2024), tau-bench, pass^k: C(c,k)/C(n,k). With k = 1 both are c/n.
    assert stats.pass_at_k(10, 3, 1) == pytest.approx(0.3) == stats.pass_hat_k(10, 3, 1)
    assert stats.pass_at_k(3, 1, 2) == pytest.approx(1 - 1 / 3)  # C(2,2)/C(3,2) = 1/3 of pairs miss it
    assert stats.pass_hat_k(3, 2, 2) == pytest.approx(1 / 3)
    assert stats.pass_at_k(4, 0, 4) == 0.0 and stats.pass_hat_k(4, 4, 4) == 1.0
    with pytest.raises(ValueError):
        stats.pass_at_k(2, 1, 3)
    at, hat = stats.pass_curves([(2, 1), (2, 2), (1, 0)])
    assert at == {"1": round((0.5 + 1 + 0) / 3, 4), "2": round((1 + 1) / 2, 4)}
    assert hat == {"1": round((0.5 + 1 + 0) / 3, 4), "2": round((0 + 1) / 2, 4)}


def test_paired_bootstrap_is_deterministic_and_brackets_the_mean() -> None:
    diffs = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.5, 1.0]
    lo, hi = stats.paired_bootstrap(diffs) or (math.nan, math.nan)
    assert lo <= sum(diffs) / len(diffs) <= hi and 0.0 <= lo < hi <= 1.0
    assert stats.paired_bootstrap(diffs) == (lo, hi)
    assert stats.paired_bootstrap([0.0] * 5) == (0.0, 0.0)
    assert stats.paired_bootstrap([]) is None


def test_paired_bootstrap_past_max_cases_is_its_normal_limit() -> None:
    # 0/1 differences, 300 cases: the resampled interval and its normal limit agree closely.
    diffs = [1.0] * 180 + [0.0] * 120
    lo, hi = stats.paired_bootstrap(diffs) or (0.0, 0.0)
    blo, bhi = stats.paired_bootstrap(diffs, max_cases=10_000) or (0.0, 0.0)
    half = stats.Z95 * math.sqrt(0.6 * 0.4 / 300)
    assert (lo, hi) == pytest.approx((0.6 - half, 0.6 + half))
    assert abs(lo - blo) < 0.01 and abs(hi - bhi) < 0.01


def test_mcnemar_in_log_space_agrees_with_the_integer_sum() -> None:
    for b, c in ((90, 130), (400, 460), (3, 250)):
        n, m = b + c, min(b, c)
        exact = 2 * sum(math.comb(n, i) for i in range(m + 1)) / 2**n
        assert stats.mcnemar_exact(b, c).p_value == pytest.approx(min(1.0, exact), rel=1e-9, abs=1e-300)
