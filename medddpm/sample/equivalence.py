"""The sampler equivalence gate: is another sampler as good as DDPM 250, within margins fixed first?

The numerics gate (``gate``: the reference's per-subject band) judges the same sampler, seeds and
timesteps under another configuration; it cannot judge a different sampler, which draws other
samples: DDPM 250 with other seeds fails it too. This gate judges a sampler by two one-sided tests
(Schuirmann 1987) on the validation subjects, one measure at a time:

* per subject, the mean over an arm's seeds of each ``MEASURES`` entry (``anatomy.measures``; SSIM
  between seeds over the seed pairs inside the arm);
* the paired difference candidate − reference over subjects, and its 90 % confidence interval
  (Student's t, two one-sided tests at ``ALPHA`` = 5 %);
* the measure passes when the interval lies inside ±margin; the sampler passes when every measure does.

Margins (``margins``), fixed before any candidate is sampled: for in-brain r, region r and W1,
``RELATIVE_MARGIN`` (5 %) of the reference's own distance from the training-mean template on that
measure, which is what the model adds over the trivial baseline; ``ABSOLUTE_MARGINS`` for the
background mean and the SSIM between seeds.

Before it decides anything the gate is calibrated (``calibration``): the reference on other seeds must
pass, a deliberately poor sampler must fail, and ``detects`` says the smallest shift it fails with
95 % probability at this number of subjects and seeds. The reference is compared with other seeds of
itself in the same way as every candidate, whose seeds are those of the reference's second arm.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from ..core.errors import InputError
from .anatomy import TEMPLATE

MEASURES = ("brain_corr", "region_corr", "hist_w1", "background_mean", "ssim_between_seeds")  # judged, in order
RELATIVE_MARGIN = 0.05  # of the reference's distance from the template, for the measures below
RELATIVE = ("brain_corr", "region_corr", "hist_w1")  # measures whose margin is relative to the template's gap
ABSOLUTE_MARGINS = {"background_mean": 0.01, "ssim_between_seeds": 0.01}  # on the [−1, 1] scale / SSIM itself
ALPHA = 0.05  # each one-sided test's level: the interval is 1 − 2α = 90 %
POWER = 0.95  # ``detects``: the shift failed with this probability
RULES = ("equivalence", "non-inferiority")  # judge's rule: two one-sided tests on every measure, or (declared for
# issue 75 before its checkpoints existed) one on the quality measures, worse oriented positive, diversity two-sided
WORSE = {"brain_corr": -1.0, "region_corr": -1.0, "hist_w1": +1.0, "background_mean": +1.0}  # non-inferiority: the
# sign that makes "worse than the reference" positive; background_mean is judged as its gap |sample − scan|


@dataclass(frozen=True)
class Arm:
    """One sampler run over a set of seeds: its rows in the anatomy tables."""

    run: str  # the tables' run name, 'spec:config' ('ddpm250:fast', 'dpm2m-sde12-logsnr-eta1.2:fast')
    seeds: tuple[int, ...]  # `medddpm sample --seed` values of its samples

    @property
    def label(self) -> str:
        """'ddpm250:fast seeds 0-15' (a range where the seeds are consecutive)."""
        s = sorted(self.seeds)
        seeds = f"{s[0]}-{s[-1]}" if s == list(range(s[0], s[-1] + 1)) and len(s) > 1 else ",".join(map(str, s))
        return f"{self.run} seeds {seeds}"


def _check(samples: pd.DataFrame, arm: Arm) -> None:
    have = set(samples.loc[samples["run"] == arm.run, "seed"])
    missing = sorted(set(arm.seeds) - have)
    if missing:
        raise InputError(f"no samples of {arm.run} for seeds {missing}")
    if len(arm.seeds) < 2:
        raise InputError(f"{arm.label}: an arm needs at least 2 seeds (SSIM between seeds)")


def subject_means(samples: pd.DataFrame, diversity: pd.DataFrame, arm: Arm) -> pd.DataFrame:
    """Per subject (index), the mean over ``arm``'s seeds of every ``MEASURES`` entry; SSIM between
    seeds over the pairs of the diversity table whose two seeds both belong to the arm."""
    _check(samples, arm)
    own = samples[(samples["run"] == arm.run) & samples["seed"].isin(arm.seeds)]
    out = own.groupby("subject")[[m for m in MEASURES if m != "ssim_between_seeds"]].mean()
    pairs = diversity[(diversity["run"] == arm.run) & diversity["seed_a"].isin(arm.seeds)
                      & diversity["seed_b"].isin(arm.seeds)]
    if pairs.empty:
        raise InputError(f"{arm.label}: no pair of its seeds in the diversity table")
    out["ssim_between_seeds"] = pairs.groupby("subject")["ssim_between_seeds"].mean()
    if out.isna().any().any():
        raise InputError(f"{arm.label}: a subject lacks a measure (NaN): {out[out.isna().any(axis=1)].index[:5].tolist()}")
    return out


def margins(samples: pd.DataFrame, diversity: pd.DataFrame, reference: Arm) -> dict[str, float]:
    """Each measure's margin: ``RELATIVE_MARGIN`` of |reference − template| (means over subjects) for
    ``RELATIVE``, ``ABSOLUTE_MARGINS`` for the others."""
    ref = subject_means(samples, diversity, reference)
    template = samples[samples["run"] == TEMPLATE].groupby("subject")[list(RELATIVE)].mean()
    if template.empty:
        raise InputError(f"no {TEMPLATE!r} rows: the margins are relative to the training-mean template")
    gap = (ref[list(RELATIVE)] - template.reindex(ref.index)).mean()
    out = {m: RELATIVE_MARGIN * abs(float(gap[m])) for m in RELATIVE}
    return {m: out.get(m, ABSOLUTE_MARGINS.get(m)) for m in MEASURES}  # type: ignore[misc]


def interval(diffs: Sequence[float] | np.ndarray, alpha: float = ALPHA) -> tuple[float, float, float, float]:
    """(mean, low, high, standard error) of the paired differences: the 1 − 2α Student-t interval
    of two one-sided tests at α each."""
    from scipy.stats import t as student

    d = np.asarray(diffs, dtype=np.float64)
    if len(d) < 2:
        raise InputError(f"an interval needs at least 2 subjects, got {len(d)}")
    se = float(d.std(ddof=1) / np.sqrt(len(d)))
    half = float(student.ppf(1 - alpha, len(d) - 1)) * se
    mean = float(d.mean())
    return mean, mean - half, mean + half, se


def detects(margin: float, se: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true shift that fails the gate with probability ``power``, given the standard
    error ``se`` of ``n`` subjects' paired differences (normal approximation): a candidate passes only
    when its mean lies within margin − t·se of 0, so a shift of margin − t·se + z·se fails with
    probability ``power``; 0 when t·se ≥ margin (then the gate fails every candidate)."""
    from scipy.stats import norm, t as student

    room = margin - float(student.ppf(1 - alpha, n - 1)) * se
    return 0.0 if room <= 0 else room + float(norm.ppf(power)) * se


def _scan_background(samples: pd.DataFrame) -> pd.Series:
    """Each subject's own scan's background mean (the ``real`` rows), what a sample's background gap is taken from."""
    from .anatomy import REAL

    real = samples[samples["run"] == REAL].groupby("subject")["background_mean"].mean()
    if real.empty:
        raise InputError(f"no {REAL!r} rows: non-inferiority judges the background by its gap to the subject's scan")
    return real


def judge(samples: pd.DataFrame, diversity: pd.DataFrame, reference: Arm, candidate: Arm,
          margin: Mapping[str, float], alpha: float = ALPHA, rule: str = "equivalence") -> pd.DataFrame:
    """One row per measure: the mean paired difference candidate − reference over the subjects both
    arms sampled, its interval, the margin, whether it passes, the standard error and the smallest
    shift the gate detects (``detects``).

    ``rule`` "equivalence": every interval inside ±margin. "non-inferiority": for ``WORSE``'s measures the
    difference is oriented so that worse is positive (the background as the gap |background − scan's|), and the
    interval's upper end must lie below +margin: a candidate nearer the scans passes (``nearer``: the interval lies
    below zero); diversity stays two-sided."""
    if rule not in RULES:
        raise InputError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    ref, cand = subject_means(samples, diversity, reference), subject_means(samples, diversity, candidate)
    subjects = ref.index.intersection(cand.index)
    if len(subjects) < len(ref.index):
        raise InputError(f"{candidate.label} lacks subjects of the reference: "
                         f"{sorted(set(ref.index) - set(cand.index))[:5]}")
    scan = _scan_background(samples).reindex(subjects) if rule == "non-inferiority" else None
    rows = []
    for m in MEASURES:
        one_sided = rule == "non-inferiority" and m in WORSE
        a, b = cand.loc[subjects, m], ref.loc[subjects, m]
        if one_sided and m == "background_mean":
            a, b = (a - scan).abs(), (b - scan).abs()
        diff = WORSE[m] * (a - b) if one_sided else a - b
        mean, low, high, se = interval(diff, alpha)
        passes = high < margin[m] if one_sided else -margin[m] < low and high < margin[m]
        rows.append({"candidate": candidate.run, "seeds": len(candidate.seeds), "reference": reference.run,
                     "reference_seeds": len(reference.seeds), "subjects": len(subjects), "measure": m,
                     "difference": mean, "low": low, "high": high, "margin": margin[m], "passes": bool(passes),
                     "se": se, "detects": detects(margin[m], se, len(subjects), alpha),
                     "rule": "non-inferiority" if one_sided else "equivalence", "nearer": bool(one_sided and high < 0)})
    return pd.DataFrame(rows)


def verdict(table: pd.DataFrame) -> str:
    """'pass', or 'fail: <measures whose interval leaves the margin>' for one candidate's ``judge`` rows."""
    failed = table.loc[~table["passes"], "measure"].tolist()
    return "pass" if not failed else "fail: " + ", ".join(failed)


def judge_all(samples: pd.DataFrame, diversity: pd.DataFrame, reference: Arm, candidates: Sequence[Arm],
              alpha: float = ALPHA, rule: str = "equivalence") -> pd.DataFrame:
    """``judge`` for every candidate under the margins of ``reference`` and ``rule``, with each candidate's
    ``verdict`` on its rows."""
    margin = margins(samples, diversity, reference)
    parts = []
    for c in candidates:
        t = judge(samples, diversity, reference, c, margin, alpha, rule)
        parts.append(t.assign(candidate_seeds=c.label, verdict=verdict(t)))
    return pd.concat(parts, ignore_index=True)


def calibration(samples: pd.DataFrame, diversity: pd.DataFrame, reference: Arm, again: Arm, poor: Arm,
                alpha: float = ALPHA, rule: str = "equivalence") -> pd.DataFrame:
    """The gate's two checks before it decides anything: ``again`` (the reference on other seeds)
    must pass and ``poor`` (a sampler known to be worse) must fail; ``check`` says which is which and
    ``works`` whether the gate did what it must."""
    t = judge_all(samples, diversity, reference, [again, poor], alpha, rule)
    t["check"] = np.where(t["candidate_seeds"] == again.label, "reference on other seeds", "poor sampler")
    t["works"] = np.where(t["check"] == "reference on other seeds", t["verdict"] == "pass", t["verdict"] != "pass")
    return t
