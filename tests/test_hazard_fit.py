"""The logistic hazard's own Newton fit reaches scikit-learn's optimum (scikit-learn is the oracle)."""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression

from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.hazard import L2_C, HazardModel, fit_penalized_logistic
from acceptscope.estimators.synthetic import simulate


def _sklearn_fit(X, pos, neg, C):
    """scikit-learn on the same objective: each distinct row twice (accepted / rejected) with its weights."""
    Xd, yd = np.concatenate([X, X]), np.concatenate([np.ones(len(X)), np.zeros(len(X))])
    wd = np.concatenate([pos, neg])
    keep = wd > 0
    lr = LogisticRegression(C=C, fit_intercept=False, tol=1e-12, max_iter=100_000)
    return lr.fit(Xd[keep], yd[keep], sample_weight=wd[keep]).coef_[0]


def test_newton_fit_equals_sklearn_on_a_real_hazard_design():
    frame = BlockFrame.from_request_steps(simulate(n_requests=200, seed=4).tables["request_steps"])
    hm = HazardModel().fit(frame)
    cells = hm._logistic_cells()
    L = hm._train
    for g, (m, cell, X) in cells.items():
        y, w = L["y"][m], L["wt"][m]
        pos = np.bincount(cell, weights=w * y, minlength=X.shape[0])
        neg = np.bincount(cell, weights=w * (1 - y), minlength=X.shape[0])
        ours = fit_penalized_logistic(X, pos, neg, C=L2_C)
        ref = _sklearn_fit(X, pos, neg, L2_C)
        # the same optimum: predictions agree to well under a thousandth of a logit
        assert np.max(np.abs(X @ ours - X @ ref)) < 1e-3
        assert np.allclose(hm.coef_[g], ours, atol=1e-9)
        # a warm start (a bootstrap refit) lands on the same optimum as a cold one
        half = np.where(np.arange(len(pos)) % 2 == 0, 0.5, 1.5)
        cold = fit_penalized_logistic(X, pos * half, neg * half, C=L2_C)
        warm = fit_penalized_logistic(X, pos * half, neg * half, C=L2_C, start=ours)
        assert np.max(np.abs(X @ cold - X @ warm)) < 1e-7


def test_newton_fit_handles_separable_data_through_the_penalty():
    X = np.array([[1.0, -2.0], [1.0, -1.0], [1.0, 1.0], [1.0, 2.0]])
    pos, neg = np.array([0.0, 0.0, 3.0, 4.0]), np.array([5.0, 2.0, 0.0, 0.0])
    b = fit_penalized_logistic(X, pos, neg, C=L2_C)
    assert np.all(np.isfinite(b)) and b[1] > 1.0
    assert np.max(np.abs(X @ b - X @ _sklearn_fit(X, pos, neg, L2_C))) < 1e-3
