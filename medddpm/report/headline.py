"""The book's results in one table (the intro): the paper's interventions, the training step and
the fastest sampler that passed the quality gate, per GPU."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import equivalence, manifests, paper, waiting
from .present import gpu_name
from .wording import count
from ..diffusion.solvers import CANDIDATE, REFERENCE
from .tables import SCOPES, bench, normalized_scopes


DEFAULT_RUN = equivalence.bench_name(REFERENCE.sampler, REFERENCE.steps)  # `sample`'s default in chapter 16's bench
CHAIN = equivalence.bench_name(CANDIDATE.sampler, CANDIDATE.steps)  # the sampler gate's chain there


def headline(root: Path, gpus: list[str]) -> pd.DataFrame:
    """The book's results in one table (intro), GPUs as rows so that it stays narrow whatever the
    store holds: per result, one row per GPU with a measurement (ours), the result's scope, the
    paper's value where it states one (its H100) and the chapter, written on the result's first
    row only."""
    rows: list[dict] = []

    def add(result: str, scope: str, chapter: str, paper_value, per_gpu: dict) -> None:
        have = [g for g in gpus if g in per_gpu and pd.notna(per_gpu[g])]
        for i, g in enumerate(have):
            first = i == 0
            rows.append({"result": result if first else "", "scope": scope if first else "", "GPU": gpu_name(g),
                         "ours": per_gpu[g], "paper (H100)": paper_value if first else "",
                         "chapter": chapter if first else ""})

    ref61 = paper.values(figure="§6.1")
    ref61 = ref61[(ref61["gpu"] == "H100") & (ref61["metric"] == "norm_cycles")].set_index("config")

    def stated(cfg: str) -> str:
        if cfg not in ref61.index:
            return "not reported"
        r = ref61.loc[cfg]
        return f"{r['value']:.2f}" + (f"–{r['value_high']:.2f}" if pd.notna(r["value_high"]) else "")

    norm = normalized_scopes(root, gpus)
    for cfg in ("opt1", "opt2"):
        for mode, scope in SCOPES.items():
            d = norm[(norm["config"] == cfg) & (norm["metric"] == "cycles") & (norm["mode"] == mode)] if not norm.empty else norm
            if d.empty:
                continue
            add(f"cycles of {cfg} (× baseline)", scope, "Interventions",
                stated(cfg) if mode == "paper" else "not reported", dict(zip(d["gpu"], d["measured"])))
    b = bench(root, gpus, ["baseline", "opt1", "opt2", "fast"])
    for cfg, chapter in (("opt1", "End to end"), ("opt2", "End to end"), ("fast", "Beyond the paper")):
        d = b[b["config"] == cfg] if not b.empty else b
        if not d.empty:
            add(f"training step of {cfg} (× faster than baseline)", "whole step, 128³", chapter, "not reported",
                dict(zip(d["gpu_slug"], d["speedup_vs_baseline"])))
            add(f"training step of {cfg} (ms)", "whole step, 128³", chapter, "not reported",
                dict(zip(d["gpu_slug"], d["step_ms_median"])))
    secs = {g: equivalence.seconds(root, g).set_index("sampler")["s / volume"] for g in gpus}
    for sampler, what in ((DEFAULT_RUN, f"`sample`'s default, {REFERENCE.sampler.upper()} {REFERENCE.steps}"),
                          (CHAIN, f"the {CANDIDATE.steps}-call chain {CHAIN} (chapter 16: not confirmed, one option away)")):
        add(f"sampling one volume, {what} (s)", "whole chain, 128³, batch 1, fast", "Sampler equivalence",
            "not reported", {g: s[sampler] for g, s in secs.items() if sampler in s.index})
    now = waiting.state(root, gpus).set_index(["GPU", "what"])["today (s)"]
    warm, cold = (r[0] for r in waiting.STATE_ROWS[:2])  # today's default, 1 mask: warm and empty cache
    walls = {g: [now.get((gpu_name(g), w)) for w in (cold, warm)] for g in gpus}
    walls = {g: " / ".join("—" if w is None else f"{w:.1f}" for w in ws)
             for g, ws in walls.items() if any(w is not None for w in ws)}
    if walls:  # what the user waits for, beside the steady state above
        add("`medddpm sample` of one mask, today's default: process start to file written (s)",
            "cold / warm compile cache, 128³", "Time to result", "not reported", walls)
    return pd.DataFrame(rows, columns=["result", "scope", "GPU", "ours", "paper (H100)", "chapter"])


README_GPU = "h100-80gb-hbm3"  # the GPU the README quotes (the one every measurement ran on)


def readme_lines(root: Path) -> list[str]:
    """The README's headline numbers, one line each with its chapter, computed from the store (the
    README holds exactly these lines: ``python -m medddpm.report.headline`` prints them and a test
    checks them); a line whose data the store lacks is left out."""
    from . import anatomy, fast_tables, tables

    gpus = tables.select_gpus(root, None)
    g, out = README_GPU, []
    single = [x for x in gpus if "-x" not in x]  # one GPU each: every one the store measured, the README's first
    single = sorted(single, key=lambda x: x != g)
    b = bench(root, single, ["baseline", "opt1", "opt2", "fast"])
    per = {x: d.set_index("config") for x, d in b.groupby("gpu_slug")} if len(b) else {}
    have = [x for x in single if x in per and {"opt1", "opt2", "fast"} <= set(per[x].index)]
    ch = lambda n, name: f"[chapter {n}](notebooks/{name}.py)"  # noqa: E731
    on = lambda x: f"an {gpu_name(x).split()[0]}"  # noqa: E731
    if have:
        speed = lambda c, d: " / ".join(f"{per[x].loc[c, 'speedup_vs_baseline']:.{d}f}×" for x in have)  # noqa: E731
        where = " / ".join(on(x) for x in have)
        out.append(f"- TF32 (OPT1): a training step {speed('opt1', 1)} faster than true FP32 at 128³ on {where}; "
                   f"3D channels-last (OPT2): {speed('opt2', 2)} — {ch('05', '05_end_to_end')}.")
        out.append("- `fast`: " + "; ".join(f"{per[x].loc['fast', 'speedup_vs_baseline']:.1f}× faster than true FP32, "
                                            f"{per[x].loc['fast', 'step_ms_median']:.1f} ms a step at 128³ on {on(x)}"
                                            for x in have) + f" — {ch('06', '06_beyond')}.")
    out.extend(recipe_line(root, gpus, ch))
    scaling = fast_tables.scaling_line(fast_tables.scaling(root)[0])
    if scaling:
        out.append(f"- Several GPUs: `fast` {scaling} — {ch('06', '06_beyond')}.")
    st = anatomy.state(root, anatomy.anatomy_gpu(root, gpus)).set_index("measure (validation subjects)")
    small, big = st.columns[0], st.columns[1]
    gap, r, dice, runs = (st.loc[k] for k in ("background mean, sample − scan (mean over seeds)", "in-brain r",
                                              "segmentation Dice, synthetic- against real-trained",
                                              "runs (steps of their checkpoints)"))
    if gap[small] != "—":
        larger = (f"; at {big} ({runs[big]}) background {gap[big]}, in-brain r {r[big]}, segmentation Dice of "
                  f"synthetic- against real-trained {dice[big]}" if gap[big] != "—" else "")
        out.append(f"- Real brains (IXI, v-prediction, validation subjects): at {small} background {gap[small]} from the "
                   f"scans', in-brain r {r[small]}{larger} — {ch('14', '14_anatomy')}.")
    secs = equivalence.seconds(root, g).set_index("sampler")
    if {DEFAULT_RUN, CHAIN} <= set(secs.index):
        out.append(f"- Sampling a 128³ volume on an H100: {secs.loc[DEFAULT_RUN, 's / volume']:.2f} s with the default, "
                   f"DDPM 250; {secs.loc[CHAIN, 's / volume']:.2f} s with the {CANDIDATE.steps}-call chain `{CANDIDATE.describe()}`, "
                   f"which the sampler gate chose on one checkpoint: "
                   f"{equivalence.confirmed(equivalence.under_both_rules(root, g), equivalence.chosen_on(root, g))} — "
                   f"{ch('16', '16_equivalence')}.")
    state = waiting.state(root, single).set_index(["GPU", "what"])["today (s)"]
    said = []
    for x in single:
        d_warm, d_cold, c_warm, c_cold = (state.get((gpu_name(x), r[0])) for r in waiting.STATE_ROWS[:4])
        parts = [f"{v:.1f} s {how}" for v, how in ((d_warm, "warm"), (d_cold, "with an empty compile cache")) if v is not None]
        chain = [f"{v:.1f} s {how}" for v, how in ((c_warm, "warm"), (c_cold, "empty")) if v is not None]
        if parts:
            said.append(f"{' and '.join(parts)} by default (DDPM 250) on {on(x)}"
                        + (f" (the {CANDIDATE.steps}-call chain: {', '.join(chain)})" if chain else ""))
    if said:
        out.append("- `medddpm sample` of one mask, process start to file: " + "; ".join(said)
                   + f" — {ch('15', '15_time_to_result')}.")
    runs = waiting.limit_runs(root, gpus)
    clock = runs[runs["run"] == f"{waiting.EVAL_CUT}/train64-stdout-warm"] if len(runs) else runs
    if len(clock):
        shares = ", ".join(f"{100 * r.share:g} % on an {gpu_name(r.gpu).split()[0]}" for r in clock.itertuples())
        out.append(f"- `medddpm train --time-limit 300` on IXI 64³ (`prepare-ixi`'s data, warm compile cache) "
                   f"spends {shares} of its time in steady steps — {ch('15', '15_time_to_result')}.")
    return out


def _other_seeds(p: dict) -> str:
    """The same 128³ command's older runs on other seeds (``recipe.plateaus``' ``seeds``): each seed's steps to the
    target and lowest held-out loss, so one seed's line reads beside the others; "" where there are none."""
    def seed(q: dict) -> int:
        return manifests.seed(q["manifest"]["arms"][q["name"]]["flags"])

    def wall(q: dict) -> str:  # a measured run's minutes to the target; an emulating run's are projected elsewhere
        return "" if "emulates" in q["manifest"] else f", {q['record']['wall at target (min)']:.1f} min"

    told = [f"seed {seed(q)}: {q['record']['step at target']:,.0f} steps{wall(q)}, lowest {q['record']['lowest loss']:.4f}"
            for q in p["seeds"]]
    return f" (seed {seed(p)}; the same command on {'; '.join(told)})" if told else ""


def _same_change(runs: pd.DataFrame, best: pd.Series) -> pd.DataFrame:
    """``best``'s run and the other seeds of its change on its day and GPUs (``recipe.big_records`` rows, by run)."""
    return runs[(runs["recipe"] == best["recipe"]) & (runs["date"] == best["date"]) & (runs["GPUs"] == best["GPUs"])]


def _seeds_of(runs: pd.DataFrame, best: pd.Series) -> str:
    """How a 128³ record is quoted: "one seed", or its seed among the change's others with their minutes to the target
    (never reached: said so), and an arm added after reading the declared ones."""
    from . import recipe

    others = _same_change(runs, best).drop(index=best.name)
    if others.empty:
        return recipe.provenance(best)
    times = ", ".join("not reached" if pd.isna(r) else f"{r:.1f} min" for r in others["wall at target (min)"])
    return (f"the fastest of {len(others) + 1} seeds of the same command, the other{'s' if len(others) > 1 else ''} "
            f"{times}" + ("" if best["declared"] else ", an arm added after reading the declared ones"))


def _passed(verdicts: pd.Series, runs: pd.DataFrame, best: pd.Series) -> bool:
    """Whether a 128³ record's change may be quoted: its samples were judged, and every judged seed's met chapter 14's
    targets (``verdicts``: ``recipe.meets_targets``)."""
    mine = verdicts.reindex(_same_change(runs, best).index).dropna()
    return bool(len(mine)) and bool(mine.all())


def recipe_line(root: Path, gpus: list[str], ch) -> list[str]:
    """The time-to-trained-model lines: at 128³ the plateau run and the fastest run to its target; at 64³ the fastest
    declared arm of any recipe A/B to its target (any arm where none was declared), its recipe's other declared runs
    and judged samples, a sooner arm added after reading, and the paper's recipe in steps (chapter 17); none where the
    store has no such run or no arm got there."""
    from . import recipe

    verdicts = recipe.meets_targets(recipe.samples(root, gpus, 128).set_index("arm"))
    out = []  # a plateau run whose judged samples missed chapter 14's targets is not quoted (chapter 17 shows it)
    found = [p for p in recipe.plateaus(root, gpus) if verdicts.get(p["name"], True)]
    told = {q["name"] for p in found for q in (p, *p["seeds"])}  # each run with a line of its own
    measured = [p for p in found if "emulates" not in p["manifest"]]
    last = {int(p["record"]["GPUs"]): p["name"] for p in measured}  # the fastest run on N GPUs follows their last line
    for p in found:
        mine, runs = p["record"], p["records"]
        if "emulates" in p["manifest"]:
            m, k, there = p["manifest"], p["manifest"]["emulates"], p["measured"]
            check = (f"a projection; on {k} × {gpu_name(there['gpu'])} the same update took "
                     f"{there['record']['step at target']:,.0f} steps, {there['record']['minutes at target']:.1f} min of "
                     f"steps at {there['record']['ms a step']:.1f} ms" if there is not None
                     else f"a projection: no run on {k} GPUs measured it")
            out.append(f"- Projected at 128³ on {k} GPUs ({mine['recipe']}: {k} GPUs' update, emulated on {mine['GPUs']} × "
                       f"{gpu_name(p['gpu'])}): held-out loss {p['target']:g} after {mine['step at target']:,.0f} steps, "
                       f"{recipe.projected_minutes(m, mine['step at target']):.1f} min of steps at "
                       f"{m['target']['projection_ms']:g} ms a step ({check}); its "
                       f"lowest held-out loss {mine['lowest loss']:.4f} at step {mine['step at lowest']:,}{_other_seeds(p)}; on the "
                       f"{mine['GPUs']} × {gpu_name(p['gpu'])} itself, {p['wall'] / 60:.1f} min from `train`'s start to its "
                       f"checkpoint — {ch('17', '17_time_to_trained')}.")
            continue
        paper = runs[runs["recipe"] == recipe.PAPER_AT_BOOK_RATE]
        same = paper[(paper["GPUs"] == mine["GPUs"]) & (paper["step at target"].notna())]
        before = (f" (Med-DDPM's recipe: {same['step at target'].iloc[0]:,.0f} steps, {same['minutes at target'].iloc[0]:.1f} "
                  "min of steps)" if len(same) else "")
        default = f", `train`'s default recipe at {count(int(mine['global batch']), 'volume')} a step" if recipe.runs_default(p["manifest"]["arms"][p["name"]]) else ""
        out.append(f"- Time to a trained model at 128³ on IXI ({mine['GPUs']} × {gpu_name(p['gpu'])}, {mine['recipe']}{default}, "
                   f"warm cache): {p['wall'] / 60:.1f} min from `train`'s start to its checkpoint ({mine['steps']:,} steps; "
                   f"its lowest held-out loss {mine['lowest loss']:.4f} at step {mine['step at lowest']:,}"
                   f"{_other_seeds(p)}), at "
                   f"{mine['ms a step']:.1f} ms a step; held-out loss {p['target']:g} after {mine['step at target']:,.0f} "
                   f"steps, {mine['wall at target (min)']:.1f} min from its start less the evaluations, "
                   f"{mine['minutes at target']:.1f} min of steps{before} — {ch('17', '17_time_to_trained')}.")
        best = recipe.record_128(runs, int(mine["GPUs"]))
        faster = best["wall at target (min)"] < pd.Series([q["record"]["wall at target (min)"] for q in measured
                                                           if q["record"]["GPUs"] == mine["GPUs"]]).min()
        if last[int(mine["GPUs"])] == p["name"] and best.name not in told and faster and _passed(verdicts, runs, best):
            told.add(best.name)
            out.append(f"- Fastest to that loss at 128³ ({best['GPUs']} GPUs): {best['wall at target (min)']:.1f} min from "
                       f"`train`'s start less the evaluations, {best['step at target']:,.0f} steps of {best['recipe']} "
                       f"({_seeds_of(runs, best)}; DDPM 250's samples within chapter 14's targets) — "
                       f"{ch('17', '17_time_to_trained')}.")
    sooner = recipe.record_64(root, gpus)
    if sooner is None:
        return out
    found = recipe.record_64(root, gpus, declared=True) or sooner
    gpu, _, m, best = found
    target = m["target"]["heldout"]
    paper_runs = recipe.paper_recipe_steps(root, target)
    hit = paper_runs["step at target"].dropna()
    long_enough = (paper_runs["steps"] >= hit.min()).sum() if len(hit) else 0  # runs that trained as far as the first hit
    paper_part = (f"; Med-DDPM's recipe at the book's rate got there in {int(hit.min()):,}–{int(hit.max()):,} steps in "
                  f"{len(hit)} of its {long_enough} runs that trained that long" if len(hit) else "")
    seeds = recipe.default_seeds(root, gpus, target)
    default_part = (f"; `train`'s default recipe (`--steps` and `--seed` alone, one volume a step as `recipe_ab.sh` runs "
                    f"every arm) reached it in "
                    f"{int(seeds['step at target'].notna().sum())} of {len(seeds)} runs" if len(seeds) else "")
    sooner = sooner[3]
    sooner_part = (f"; {sooner['wall at target (s)']:.0f} s with `{sooner['flags']}` ({recipe.provenance(sooner)})"
                   if sooner["wall at target (s)"] < best["wall at target (s)"] else "")
    reps = recipe.repeats(root, gpus, best["flags"], target)
    more = reps[(reps["arm"] != best["arm"]) & reps["declared"]]
    reached = more["wall at target (s)"].dropna()
    span = ("" if reached.empty else f", in {reached.min():.0f}" + (
        "" if round(reached.min()) == round(reached.max()) else f"–{reached.max():.0f}") + " s")
    more_part = (f"; the same recipe's other declared runs ({len(more)}, seeds "
                 f"{', '.join(str(x) for x in sorted(more['seed'].unique()))}): {len(reached)} reached it{span}"
                 if len(more) else "")
    every = recipe.samples(root, gpus)
    judged = every.merge(reps[["arm"]], on="arm")
    judged_part = (f"; DDPM 250's samples of {len(judged)} of its runs: in-brain r {judged['in-brain r'].min():.3f}–"
                   f"{judged['in-brain r'].max():.3f} (the template's {every['in-brain r'].iloc[0]:.3f})"
                   if len(judged) else "")
    return out + [f"- Time to a trained model at 64³ on IXI (held-out loss ≤ {target:g}, one {gpu_name(gpu).split()[0]}): "
            f"{best['wall at target (s)']:.0f} s from the command's start less the evaluations, {int(best['step at target']):,} "
            f"steps of `{best['flags']}` ({recipe.provenance(best)}){more_part}{judged_part}{sooner_part}{default_part}"
            f"{paper_part} — {ch('17', '17_time_to_trained')}."]


if __name__ == "__main__":
    print("\n".join(readme_lines(Path(__file__).resolve().parents[2] / "data" / "results")))
