"""How much audit is enough: the audit fraction that brings a run's mean-ceiling interval to a target width.

Why: the compact arm alone cannot see past its windows, so its interval carries the band of the shift
past the walk (:mod:`estimators.margin`); a cap-accept audit of part of the traffic measures that shift,
and the band narrows as ``1/sqrt(audited requests)`` (the shift's uncertainty is the spread between
audited requests). The rest of the interval (the imputation noise of the unresolved blocks, the hazard
refits) does not shrink with auditing, so a target narrower than it is out of reach: more traffic, not
more audit.

The reading, from what the estimate already holds:

* the run's 95% interval width ``w`` and the band's part of it ``w_band`` (the mean ceiling at the band's
  two ends); the rest ``w_rest``: ``w - w_band`` under the prior alone (its band is added to the sampling
  quantiles whole: a range, not a law), ``sqrt(w^2 - w_band^2)`` once an audit measured the shift (its
  posterior rides on the hazard refits, so the parts combine in quadrature);
* the band in logits ``d`` now, and the per-request spread ``sigma`` of the shift: read off the audit's band
  (:func:`sigma_from_audit`) when there is one, else :data:`SIGMA_PER_REQUEST`;
* a target half-width ``h``: with an audit the band must shrink to ``w_band' = sqrt((2h)^2 - w_rest^2)``,
  i.e. ``d' = d w_band' / w_band``, which takes ``n' = (2 z sigma / d')^2`` audited requests with an open
  block; requests with an open block are a share of all requests (the run's own count), so the fraction is
  ``n' / open requests``.

Example::

    >>> a = audit_advice(width=0.20, band_width=0.15, band=(-2.5, 0.5), n_requests=1000, n_open_requests=600,
    ...                  audit=None, half_width=0.05)
    >>> a["reachable"], a["audited_requests"] > 0, 0 < a["fraction"] <= 1
    (True, True, True)
"""

from __future__ import annotations

import math

from acceptscope.estimators.margin import SIGMA_PER_REQUEST, SIGMA_QUARTILES, Z95  # SIGMA_*: the spread no audit measured
TARGETS = (0.05, 0.10)  # half-widths (drafts) the estimate gives advice for


def sigma_from_audit(audit: dict | None) -> float | None:
    """The per-request spread of the shift as an audit's band shows it, ``d sqrt(n) / 2z`` (None: no informative
    audit). Read off the band itself, so the advice scales the band the estimate actually printed."""
    if not audit or audit.get("n_requests", 0) < 2 or not audit.get("band"):
        return None
    lo, hi = audit["band"]
    return (hi - lo) * math.sqrt(audit["n_requests"]) / (2 * Z95)


def audit_advice(width: float, band_width: float, band: tuple[float, float], n_requests: int, n_open_requests: int,
                 audit: dict | None, half_width: float) -> dict:
    """The audit that brings the interval to +-``half_width`` drafts (see the module docstring)."""
    # the interval adds the prior's band to the sampling quantiles whole; an audit's posterior rides on the hazard
    # refits, so the parts combine in quadrature (an audit is what the advice is about: the target is read that way)
    rest = math.sqrt(max(width ** 2 - band_width ** 2, 0.0)) if audit else max(width - band_width, 0.0)
    out = dict(half_width=half_width, width_now=width, band_part=band_width, rest_part=rest)
    sigma = sigma_from_audit(audit)
    out["sigma_source"] = "this run's audit" if sigma is not None else "the validation grid's tune split"
    sigma = SIGMA_PER_REQUEST if sigma is None else sigma
    if width <= 2 * half_width:
        got = int((audit or {}).get("n_audited_requests", 0))
        return dict(out, reachable=True, audited_requests=got, fraction=got / max(n_requests, 1),
                    why="the interval is that narrow already")
    if band_width <= 0 or 2 * half_width <= rest:
        return dict(out, reachable=False, audited_requests=None, fraction=None,
                    why=(f"the interval's part that auditing does not shrink (imputation noise, hazard refits) is "
                         f"{rest:.3f} drafts wide already: more traffic, not more audit"))
    d_now = band[1] - band[0]
    d_need = d_now * math.sqrt((2 * half_width) ** 2 - rest ** 2) / band_width
    n_need = math.ceil((2 * Z95 * sigma / d_need) ** 2)
    open_share = n_open_requests / max(n_requests, 1)
    fraction = min(1.0, n_need / max(n_open_requests, 1))
    if out["sigma_source"] != "this run's audit":  # the spread is the tune split's: its quartiles give a range
        out["fraction_range"] = [min(1.0, (2 * Z95 * s / d_need) ** 2 / max(n_open_requests, 1)) for s in SIGMA_QUARTILES]
    return dict(out, reachable=n_need <= n_open_requests, audited_requests=int(math.ceil(fraction * n_requests)),
                fraction=fraction, open_share=open_share,
                why=(f"the band past the walk must narrow from {d_now:.2f} to {d_need:.2f} logits: about {n_need} "
                     f"audited requests with an unresolved block ({open_share:.0%} of this run's requests have one)"))


def advice_for(summary_counts: dict, run_interval: tuple[float, float], prior: dict | None) -> list[dict]:
    """The advice for each of :data:`TARGETS`, from a tail result's counts, its run interval and the prior
    in force (``hazard_info['unobserved_prior']``); empty when nothing past a window is estimated."""
    if not prior:
        return []
    n = max(summary_counts["n"], 1)
    band_width = (summary_counts.get("sum_sens_hi", 0.0) - summary_counts.get("sum_sens_lo", 0.0)) / n
    lo, hi = run_interval
    audit = prior.get("audit")
    return [audit_advice(hi - lo, band_width, tuple(prior["band"]), summary_counts.get("n_requests", 0),
                         summary_counts.get("n_open_requests", 0), audit, h) for h in TARGETS]


def advice_sentences(advice: list[dict]) -> list[str]:
    """One line per target, as the CLI, the report and the dashboard state it."""
    out = []
    for a in advice or []:
        h = a["half_width"]
        if a["width_now"] <= 2 * h:  # audit_advice's first case
            out.append(f"±{h:.2f} drafts: the interval is that narrow already")
        elif a["reachable"]:
            rng = a.get("fraction_range")
            span = f" (between {rng[0]:.0%} and {rng[1]:.0%} at the tune split's quartiles of the spread)" if rng else ""
            out.append(f"±{h:.2f} drafts: audit about {a['fraction']:.0%} of the traffic{span} ({a['audited_requests']} "
                       f"requests of this run's size); {a['why']}")
        else:
            out.append(f"±{h:.2f} drafts: not by auditing this traffic; {a['why']}")
    return out
