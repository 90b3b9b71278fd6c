"""The claims a run made, kept in its record and compared with the run before it in the same folder.

Asked again on the same machine, a workbook should give the same answers; where it does not, the
user's first question is which verdict flipped. Every `spire run` keeps its claims in run.json
(`record`) and, where the output folder's previous run had the same params and machine, prints
each claim whose verdict changed since (`changes`, `report`).

A claim is a statement the index makes of the run, with a verdict that can flip, read from the
results the notebooks recorded (results.json) through the index's own functions
(`spirelib.workbook.findings`, `paper_claims`), so the record says what the index said. Each is kept under a key
that names it and no rewording of the index changes (two versions of the workbook compare):
- each of the paper's claims the index checks (`paper_claims.claims`, keyed by `Claim.key`): its
  statement (the text before its evidence), verdict "reproduced" / "not reproduced" at this scale,
  or "agrees" / "differs" for the paper's own arithmetic (method §2);
- the winner of every cell of every winner map (`findings.decision_maps`, keyed by the map's key and
  the cell), AD where no draft beats it,
  "(not resolved)" where the map marks the measured winner's 95% CI as overlapping another's or AD's
  (a winner resolved in one run and not in the next has changed its verdict);
- each of SPIRe's parts that 05 ranks (`paper_claims.ablation_effects`): "helps", "harmful" or
  "not resolved" (method §10).
The evidence (the numbers behind a verdict) moves from run to run and is kept beside it, shown
with a changed verdict, never compared. The changed claims are printed by `spire run` and listed
at the top of the index (`spirelib.workbook.report`).
"""

from __future__ import annotations

from spirelib.throughput.methods import label
from spirelib.throughput.recorded_ablations import ablation_record
from spirelib.workbook import findings, paper_claims
from spirelib.workbook.narrative.winners import pow2

SHOWN = 12  # changed claims printed at most; the rest are in run.json's claims_changed


def _statement(claim: paper_claims.Claim) -> tuple[str, str]:
    """A claim of `paper_claims.claims` as (its statement, its evidence): its words (`findings.plain`)
    split at their first ": ", the index's form "Statement (how): evidence"."""
    statement, _, evidence = findings.plain(claim.text).partition(": ")
    return statement, evidence


def record(run: dict, results: dict) -> dict[str, dict]:
    """The claims the index makes of this run (module docstring): key -> {"claim" (its statement),
    "verdict", "evidence"}, in the index's order (the paper's claims, the winner maps, 05's parts)."""
    out: dict[str, dict] = {}
    for kind, found in paper_claims.claims(run, results).items():
        for c in found:
            statement, evidence = _statement(c)
            verdict = ("agrees" if c.ok else "differs") if kind == paper_claims.ARITHMETIC else kind
            out[c.key] = {"claim": statement, "verdict": verdict, "evidence": evidence}
    for m in findings.decision_maps(run, results):
        winners, Bs, Ls = m["grid"]
        unresolved = m.get("unresolved") or set()
        for i, B in enumerate(Bs):
            for j, L in enumerate(Ls):
                if winners[i][j] != "-":
                    verdict = label(winners[i][j]) + (" (not resolved)" if (i, j) in unresolved else "")
                    out[f"winner:{m['key']}:B{B}:L{L}"] = {
                        "claim": f"winner at B = {B}, L = {pow2(L)} ({m['title']})", "verdict": verdict,
                        "evidence": m["where"]}
    for parts in paper_claims.ablation_effects(ablation_record(results).importance):
        for r in parts:
            out[f"part:{r.part}"] = {"claim": f"05: {label(r.part)}", "verdict": r.effect, "evidence": ""}
    return out


def changes(before: dict[str, dict], after: dict[str, dict]) -> list[dict]:
    """Each claim whose verdict differs between two records (matched by key), in `after`'s order,
    then those only `before` made: {"claim", "before", "after", "evidence"} (a verdict None: not
    made by that run)."""
    out = []
    for key, now in after.items():
        then = before.get(key)
        if then is None or then["verdict"] != now["verdict"]:
            out.append({"claim": now["claim"], "before": then and then["verdict"], "after": now["verdict"],
                        "evidence": now["evidence"]})
    out += [{"claim": then["claim"], "before": then["verdict"], "after": None, "evidence": ""}
            for key, then in before.items() if key not in after]
    return out


def current(kept: dict | None) -> bool:
    """Whether a run.json's claims are kept in this module's form (each with its "claim"): older
    records, keyed by their wording, are read again from their results instead."""
    return bool(kept) and all("claim" in c for c in kept.values())


def comparable(previous: dict, run: dict) -> str | None:
    """Why two runs' claims cannot be compared (other params, another machine, no claims kept), or
    None where they can. `previous` and `run` are run.json records."""
    if not previous.get("claims"):
        return "the previous run in this folder kept no claims"
    if previous.get("params") != run.get("params"):
        return "the previous run in this folder had other params"
    if previous.get("machine") != run.get("machine"):
        return f"the previous run in this folder ran on another machine ({previous.get('machine')})"
    return None


def report(found: list[dict], since: str) -> str:
    """The changed claims as `spire run` prints them, `since` naming the earlier run: each claim,
    its verdict before and after, and the evidence now; "" where none changed."""
    if not found:
        return ""
    lines = [f"claims changed since the run of {since} here (same params, same machine):"]
    for c in found[:SHOWN]:
        lines.append(f"  {c['claim']}: {c['before'] or '(not made)'} -> {c['after'] or '(not made)'}")
        if c["evidence"]:
            lines.append(f"    now: {c['evidence'][:160]}")
    if len(found) > SHOWN:
        lines.append(f"  and {len(found) - SHOWN} more (run.json: claims_changed)")
    return "\n".join(lines)
