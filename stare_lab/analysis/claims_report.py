"""The claims report: Markdown, LaTeX, CSV and a figure of each claim's interval against its bound.

Input: hypotheses.verdicts' frame (one row per claim) and the claims (their sources). Every number
comes from the frame; the notes under the table say how each verdict was reached (docs/claims.md). A
sweep with a sequential design adds its section (`DesignSummary`: the design, each claim's state under it
and the look that decided it, the runs spent against the fixed design's).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from stare_lab.plan.claims import Claim

COLOURS = {"supported": "#1a9850", "contradicted": "#d73027", "undecided": "#878787", "no data": "#bdbdbd"}


@dataclass
class DesignSummary:
    """A sequential design's outcome from the records (stare_lab.sweep.sequential computes it)."""

    description: str  # stare_lab.plan.design.Design.describe()
    looks_done: int
    looks: int
    states: dict[str, tuple[str, int | None, str]]  # claim id → (state, look decided or found futile, seeds)
    spent: int  # finished runs of the looks so far
    fixed: int  # the fixed design's runs: the last look's seeds × the arms
    fixed_text: str  # "32 seeds × 15 arms"

    def lines(self) -> list[str]:
        heads = "| claim | state under the design | look | seeds per arm |\n|:--|:--|--:|:--|"
        rows = [f"| {cid} | {state} | {look or ''} | {seeds} |" for cid, (state, look, seeds) in self.states.items()]
        ratio = f" ({self.spent / self.fixed:.0%})" if self.fixed else ""
        return [
            f"Sequential design: {self.description}.",
            heads + "\n" + "\n".join(rows),
            f"Runs: {self.spent} over {self.looks_done} of {self.looks} looks, against {self.fixed} for the fixed "
            f"design ({self.fixed_text}){ratio}. The design's states are its verdicts, with the familywise error "
            "at its α over all claims and looks; the table below tests every finished run at one fixed look, "
            "which after a sequential sweep is not error-controlled.",
        ]


@dataclass
class ClaimsReport:
    frame: pd.DataFrame  # hypotheses.verdicts
    claims: list[Claim]
    sweep: str
    runs: int  # finished runs read
    alpha: float = 0.05
    notes: list[str] = field(default_factory=list)
    design: DesignSummary | None = None

    @property
    def tested(self) -> int:
        return int(self.frame["p_support"].notna().sum())

    def rows(self) -> list[dict[str, str]]:
        """The table's cells as text, one dict per claim."""
        by_id = {c.id: c for c in self.claims}
        out = []
        for r in self.frame.itertuples(index=False):
            claim = by_id[r.id]
            src = claim.source
            out.append(
                {
                    "claim": r.id,
                    "source": f"{src['arxiv']} {src['where']}" + (f" [{src['grade']}]" if "grade" in src else "")
                    if src
                    else "own",
                    "paper": f"{src['number']} ({src['model']})" if src else "–",
                    "tested": f"{r.formula}; {r.quantity}",
                    "ours": _estimate_text(r, claim),
                    "verdict": r.verdict,
                    "p_holm": "–" if _nan(r.p_support) else f"{r.p_support_holm:.2g} / {r.p_contra_holm:.2g}",
                    "seeds": "" if not isinstance(r.seeds, str) else r.seeds,
                    "needed": _needed_text(r.seeds_needed) if r.verdict == "undecided" else "",
                }
            )
        return out

    def method_notes(self) -> list[str]:
        a, m = self.alpha, self.tested
        decided = int(self.frame["verdict"].isin(["supported", "contradicted"]).sum())
        kinds = {c.quantity.kind for c in self.claims}
        notes = [
            f"Verdicts: Holm's step-down correction over the {m} claims of the file with data, α = {a:g}: supported "
            f"where the claim's one-sided test has Holm-adjusted p < {a:g}, contradicted where the opposite one-sided "
            "test's has (the claims' tests one family, the opposite tests another; p_holm: claim / opposite), "
            "undecided otherwise. Equivalence: TOST (both one-sided tests at α); contradicted when either outer "
            "test rejects (2 × its p).",
            f"Intervals: two-sided {1 - 2 * a:.0%} (the claim's one-sided {1 - a:.0%} bounds), per claim, not adjusted "
            "for Holm; a gain form shows the fraction of B's gain over base that A keeps, with Fieller's interval "
            "(unbounded where B's gain itself is not distinguishable from 0).",
        ]
        if "score" in kinds:
            notes.append(
                "Held-out scores: the seeds × problems estimator of compare_arms (crossed random effects, t with "
                "Satterthwaite's df, at 2 seeds the seed part at t(1)) on the claim's combination of arms, paired by "
                "problem and, where the arms share seeds, by seed; pass@k per problem and seed, unbiased."
            )
        if "metric" in kinds:
            notes.append(
                "Training metrics: one value per run (the last logged, or a window's mean), Welch's t over seeds."
            )
        if "spread" in kinds:
            notes.append(
                "Seed spread: Brown-Forsythe's test (Welch's t on each seed's |score − its arm's median|, one-sided); "
                "the estimate is the difference of those mean deviations in points, the arms' SDs beside it."
            )
        level = a / max(m - decided, 1)
        notes.append(
            f"Seeds needed (undecided claims): per arm, for power 0.8 at the observed variances, one-sided at "
            f"α/(m − d) = {level:.2g}, the Holm level of the next claim decided with the {decided} decided ones "
            "kept; ∞: more problems, not seeds, are needed."
        )
        notes.append(
            "A verdict is about this sweep's runs (their model, task and scale): it says whether the mechanism "
            "shows there, not whether a paper's claim holds for the paper's models."
        )
        return notes + self.notes + _claim_notes(self.frame)

    def caption(self) -> str:
        counts = self.frame["verdict"].value_counts()
        told = ", ".join(f"{int(counts[v])} {v}" for v in COLOURS if v in counts)
        return f"Claims of sweep {self.sweep}: {len(self.frame)} claims from {self.runs} finished runs: {told}."

    def to_markdown(self) -> str:
        heads = ["claim", "source", "paper (model)", "claim tested", "ours [interval]", "verdict", "p_holm", "seeds",
                 "seeds needed"]  # fmt: skip
        lines = ["| " + " | ".join(heads) + " |", "|" + ":--|" * 4 + "--:|:--|--:|:--|--:|"]
        for r in self.rows():
            verdict = f"**{r['verdict']}**" if r["verdict"] in ("supported", "contradicted") else r["verdict"]
            cells = [r["claim"], r["source"], r["paper"], r["tested"], r["ours"], verdict, r["p_holm"], r["seeds"],
                     r["needed"]]  # fmt: skip
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        design = "\n\n".join(self.design.lines()) + "\n\n" if self.design else ""
        table = "\n".join(lines)
        return f"{self.caption()}\n\n{design}" + table + "\n\n" + "\n\n".join(self.method_notes()) + "\n"

    def to_latex(self) -> str:
        out = [
            r"\begin{table}[t]",
            r"\centering",
            r"\small",
            r"\begin{tabular}{lllllll}",
            r"\toprule",
            r"Claim & Source & Paper (model) & Claim tested & Ours [interval] & Verdict & Seeds needed \\",
            r"\midrule",
        ]
        for r in self.rows():
            verdict = rf"\textbf{{{r['verdict']}}}" if r["verdict"] in ("supported", "contradicted") else r["verdict"]
            cells = [r["claim"], r["source"], r["paper"], r["tested"], r["ours"]]
            out.append(" & ".join([*map(_latex, cells), verdict, _latex(r["needed"])]) + r" \\")
        out += [r"\bottomrule", r"\end{tabular}", r"\par\smallskip"]
        notes = self.method_notes() + ([self.design.lines()[0], self.design.lines()[2]] if self.design else [])
        out.append(r"{\footnotesize " + r" \par ".join(_latex(n) for n in notes) + "}")
        out += [r"\caption{" + _latex(self.caption()) + "}", r"\end{table}"]
        return "\n".join(out) + "\n"

    def to_csv(self) -> str:
        frame = self.frame.copy()
        by_id = {c.id: c for c in self.claims}
        for key in ("arxiv", "where", "number", "model", "grade"):
            frame[f"paper_{key}"] = [by_id[i].source.get(key, "") for i in frame["id"]]
        frame["form"] = [by_id[i].form for i in frame["id"]]
        if self.design:
            frame["design_state"] = [self.design.states[i][0] for i in frame["id"]]
            frame["design_look"] = [self.design.states[i][1] for i in frame["id"]]
        buf = io.StringIO()
        frame.to_csv(buf, index=False)
        return buf.getvalue()

    def figure(self, path: Path) -> Path:
        return plot_claims(self.frame, self.claims, path, self.alpha)


def _nan(x) -> bool:
    return not isinstance(x, (int, float)) or x != x


def _estimate_text(r, claim: Claim) -> str:
    if _nan(r.estimate):
        return "no data"
    if claim.form in ("retained_gain", "gain_below"):
        return f"keeps {_num(r.estimate)} [{_num(r.lo)}, {_num(r.hi)}] of the gain"
    bounds = f"[{_num(r.lo, sign=True)}, {_num(r.hi, sign=True)}]"
    unit = "points" if r.unit == "points" else r.unit
    return f"{_num(r.estimate, sign=True)} {bounds} {unit}"


def _num(x: float, sign: bool = False) -> str:
    if not math.isfinite(x):
        return "∞" if x > 0 else "−∞"
    text = f"{x:+.3g}" if sign else f"{x:.3g}"
    return text.replace("-", "−")


def _needed_text(x) -> str:
    if _nan(x):
        return "?"
    if x == -math.inf:
        return "∞ (more problems)"
    return "> 1000" if x == math.inf else str(int(x))


def _claim_notes(frame: pd.DataFrame) -> list[str]:
    out = []
    for r in frame.itertuples(index=False):
        if isinstance(r.note, str) and r.note:
            out.append(f"{r.id}: {'no data: ' if r.verdict == 'no data' else ''}{r.note}.")
    return out


def _latex(text: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("$", r"\$")):
        text = text.replace(a, b)
    return text


def plot_claims(frame: pd.DataFrame, claims: list[Claim], path: Path, alpha: float = 0.05) -> Path:
    """One panel per claim: its estimate and interval (its own unit) against the bound the claim is tested
    against (dashed; equivalence ±margin), coloured by the verdict: `claims.png`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by_id = {c.id: c for c in claims}
    fig = Figure(figsize=(7.0, 0.75 * len(frame) + 1.0), dpi=100)
    axes = fig.subplots(len(frame), 1, squeeze=False)[:, 0]
    for ax, r in zip(axes, frame.itertuples(index=False), strict=True):
        claim = by_id[r.id]
        colour = COLOURS.get(r.verdict, "#878787")
        bounds = [-r.bound, r.bound] if claim.form == "equivalence" else [r.bound]
        finite = [v for v in (r.lo, r.hi, r.estimate, *bounds) if not _nan(v) and math.isfinite(v)]
        span = (max(finite) - min(finite)) if len(finite) > 1 else 1.0
        left, right = min(finite or [0]) - 0.15 * span - 1e-9, max(finite or [0]) + 0.15 * span + 1e-9
        for b in bounds:
            if not _nan(b):
                ax.axvline(b, color="black", linestyle="--", linewidth=1)
        if not _nan(r.estimate):
            lo = r.lo if math.isfinite(r.lo) else left
            hi = r.hi if math.isfinite(r.hi) else right
            ax.plot([lo, hi], [0, 0], color=colour, linewidth=3, solid_capstyle="butt")
            ax.plot([r.estimate], [0], "o", color=colour, markersize=6)
        ax.set_xlim(left, right)
        ax.set_yticks([])
        unit = "fraction of the gain kept" if claim.form in ("retained_gain", "gain_below") else r.unit
        ax.set_title(f"{r.id}: {r.formula} ({unit}) — {r.verdict}", fontsize=8, loc="left", color=colour)
        ax.tick_params(labelsize=7)
    fig.suptitle(
        f"Each claim's estimate with its {1 - 2 * alpha:.0%} interval against its bound (dashed); "
        f"verdicts after Holm over {int(np.isfinite(frame['p_support'].to_numpy(float)).sum())} claims",
        fontsize=8,
    )
    fig.tight_layout()
    FigureCanvasAgg(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path
