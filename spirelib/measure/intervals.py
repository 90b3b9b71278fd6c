"""Student's t quantiles, the one source of every t-interval the measurements report (tau and its
differences, method §8 and §10; the target's continuation loss; the clock's ratios)."""

from __future__ import annotations

import functools


@functools.cache
def t_quantile(p: float, dof: int) -> float:
    """Quantile of Student's t distribution with `dof` degrees of freedom (0.5 < p < 1), scipy's."""
    if not 0.5 < p < 1 or dof < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and dof >= 1, got p={p}, dof={dof}")
    from scipy.stats import t  # here, not at the top: importing scipy.stats is slow and only intervals need it

    return float(t.ppf(p, dof))
