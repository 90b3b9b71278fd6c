"""A draft's measured acceptance profile, in the form serving simulators take (docs/deploy.md, "The
acceptance profile"): per draft position j = 1..k the conditional acceptance P(draft j accepted |
drafts 1..j-1 accepted) and the marginal P(at least j drafts accepted), the mean accepted length
(tau, the bonus token included), the depth k, the contexts and how many were measured, and where
it comes from (the run, notebook 04).

Read from what notebook 04 recorded (`recorded.nearest_record`): per method and context its tau
with the contexts decoded and its per-position acceptance, with the round counts behind it where
the run recorded them (`accepted`: rounds that accepted draft j; `reached`: rounds that reached it).
From counts, the conditionals are `acceptance.per_position_from_counts` of the rounds' histogram
and each marginal is rounds with at least j accepted over all rounds, which is their cumulative
product; the mean accepted length is 1 + the sum of the marginals (`acceptance.tau_from_per_position`),
an identity of the counts, not an i.i.d. assumption, and the pooled tau 04 reports (tokens over
rounds) to rounding. A position never reached has no conditional (null); its marginal is 0.

NVIDIA Dynamo's simulator (its mocker, with AIConfigurator's timing) takes the conditional vector
(`--aic-nextn-accept-rates`, at most 5 positions); vLLM's synthetic rejection sampler the marginal
one. Numpy only.
"""

from __future__ import annotations

import math

import numpy as np

from spirelib.throughput.acceptance import per_position_from_counts, tau_from_per_position
from spirelib.throughput.methods import label
from spirelib.throughput.recorded import nearest_record, tau_protocol

SCHEMA = "spire-acceptance-profile/1"
NOTEBOOK = "04_measure_tau"  # the notebook whose record a profile reads
DYNAMO_MAX_NEXTN = 5  # Dynamo's mocker takes 1..5 draft positions (`--aic-nextn`)


def histogram_from_counts(accepted, reached) -> np.ndarray:
    """Rounds by accepted drafts 0..k from notebook 04's counts: `reached[j]` rounds reached draft
    j + 1 (reached[0]: every round), `accepted[j]` accepted it. Refused where they do not describe
    one set of rounds (a round reaches draft j + 1 exactly when it accepted draft j)."""
    a, r = np.asarray(accepted, dtype=float), np.asarray(reached, dtype=float)
    if a.ndim != 1 or a.shape != r.shape or not a.size or np.any(a < 0) or np.any(a > r) or r[0] <= 0 or np.any(
            r[1:] != a[:-1]):
        raise ValueError(f"accepted {accepted!r} and reached {reached!r} are not one set of rounds' counts")
    at_least = np.concatenate((r[:1], a, [0.0]))  # rounds with >= n accepted, n = 0..k + 1
    return at_least[:-1] - at_least[1:]


def position_profile(p=None, accepted=None, reached=None) -> dict:
    """One context's vectors: from the round counts when given (exact, with `rounds`), else from the
    conditionals `p`. JSON-ready: a conditional never reached is None."""
    rounds = None
    if accepted is not None and reached is not None:
        histogram = histogram_from_counts(accepted, reached)
        conditional = per_position_from_counts(histogram)
        rounds = int(histogram.sum())
    elif p is not None and len(p):
        conditional = np.asarray([float("nan") if v is None else v for v in p], dtype=float)
    else:
        raise ValueError("a profile needs the per-position acceptance p or its round counts")
    tau = float(tau_from_per_position(conditional))  # validates: probabilities, nan only after a 0
    marginal = np.cumprod(np.nan_to_num(conditional, nan=0.0))
    return {"conditional_accept_rates": [None if math.isnan(c) else round(float(c), 6) for c in conditional],
            "marginal_accept_rates": [round(float(m), 6) for m in marginal],
            "mean_accept_length": round(tau, 6), "rounds": rounds}


def dynamo_args(conditional: list) -> list[str]:
    """Dynamo's mocker flags for `conditional` (entry i: P(draft i accepted | all earlier accepted)),
    its first `DYNAMO_MAX_NEXTN` positions, a position never reached as 0."""
    used = [0.0 if c is None else c for c in conditional[:DYNAMO_MAX_NEXTN]]
    return ["--aic-nextn", str(len(used)), "--aic-nextn-accept-rates", ",".join(f"{c:g}" for c in used)]


def acceptance_profile(results: dict, method: str, context: int, run: str) -> dict | None:
    """`method`'s profile from a run's results (notebook 04's record): its vectors at the recorded
    context nearest `context` (the one the schedules read) and at every context it was measured at
    (`by_context`); None when the run recorded no tau for it there."""
    found = nearest_record(results, context)
    if found is None:
        return None
    recorded_taus, at = found
    taus = recorded_taus.get(method, {})
    if at not in taus:
        return None
    protocol = tau_protocol(results)
    positions = results[NOTEBOOK].get("per_position_acceptance", {}).get(method, {})
    by_context = {}
    for L in sorted(taus):
        counts = positions.get(str(L), {})
        try:
            vectors = position_profile(counts.get("p"), counts.get("accepted"), counts.get("reached"))
        except ValueError:  # no curve recorded there (or counts that do not add up): tau alone
            vectors = {"conditional_accept_rates": None, "marginal_accept_rates": None, "mean_accept_length": None,
                       "rounds": None}
        n_contexts = protocol.n_contexts if taus[L].n_contexts is None else taus[L].n_contexts
        by_context[str(L)] = {**vectors, "tau_measured": {"mean": taus[L].mean, "ci95": taus[L].ci95},
                              "n_contexts": n_contexts}
    main = by_context[str(at)]
    k = len(main["conditional_accept_rates"]) if main["conditional_accept_rates"] else protocol.k
    return {
        "schema": SCHEMA,
        "method": method,
        "label": label(method),
        "num_speculative_tokens": k,
        "context": at,
        **main,
        "context_lengths": [int(L) for L in by_context],
        "by_context": by_context,
        "measurement": {key: getattr(protocol, key) for key in ("temperature", "new_tokens", "batch_size", "seed")},
        "source": {"run": run, "notebook": NOTEBOOK, "file": "results.json",
                   "keys": [f"{NOTEBOOK}.tau", f"{NOTEBOOK}.per_position_acceptance", f"{NOTEBOOK}.tau_protocol"]},
        "dynamo_mocker_args": dynamo_args(main["conditional_accept_rates"]) if main["conditional_accept_rates"]
        else None,
    }
