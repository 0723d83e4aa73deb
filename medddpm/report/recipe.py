"""Time to a trained model (issue 75): the recipe A/B runs of a results store (manifest kind ``recipe-ab``), each
arm's held-out loss against the training clock, and its time to the target the manifest fixes."""
from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.config import DEFAULT_RECIPE, RECIPE_FIELDS, recipe_config
from ..train.timing import phase_intervals
from . import manifests
from .present import gpu_name
from .wording import count

KIND = "recipe-ab"


def provenance(row: pd.Series) -> str:
    """"one seed", and whether the arm of a ``records`` or ``big_records`` row was added after reading the declared
    ones (its manifest's ``after_reading``): how a record is quoted."""
    return "one seed" + ("" if row["declared"] else ", an arm added after reading the declared ones")


def _decimal(flags: str) -> str:
    """An arm's flags with their rates in decimals (``--lr 2e-4`` → ``--lr 0.0002``: the same option, as prose reads)."""
    return re.sub(r"(?<![\w.-])(\d+(?:\.\d+)?e-\d+)(?![\w.-])",
                  lambda m: np.format_float_positional(float(m[1]), trim="-"), flags)


def _ready(stdout: Path) -> float:
    """Seconds from the command's start to training (``train``'s ``timing: ready …`` line), NaN without it."""
    found = re.search(r"timing: ready ([\d.]+) s", stdout.read_text()) if stdout.exists() else None
    return float(found.group(1)) if found else float("nan")


def ema_curve(folder: Path) -> pd.DataFrame:
    """A run's held-out loss of the EMA weights per evaluated step (mean over subjects and t), with its training clock
    (``seconds``; NaN in runs that kept none)."""
    path = Path(folder) / "heldout.csv"
    stat = path.stat()
    return _ema_curve(str(path.resolve()), stat.st_mtime_ns, stat.st_size).copy()


@functools.lru_cache(maxsize=512)
def _ema_curve(path: str, mtime_ns: int, size: int) -> pd.DataFrame:
    """``ema_curve`` of one file as it is (its modification time and size in the key): a chapter reads each run's
    table many times."""
    h = pd.read_csv(path).query("weights == 'ema'")
    if "seconds" not in h:
        h = h.assign(seconds=float("nan"))
    return h.groupby("step", as_index=False).agg(loss=("loss", "mean"), seconds=("seconds", "first"))


def first_at(curve: pd.DataFrame, target: float) -> pd.DataFrame:
    """The first evaluation of ``curve`` at or below ``target`` (no row: never)."""
    return curve[curve["loss"] <= target].head(1)


def curves(run: Path, manifest: dict) -> pd.DataFrame:
    """One row per (arm, evaluation): the EMA's held-out loss (mean over subjects and t), the step, and the training
    clock (seconds of steps, evaluations left out) plus the arm's start-up (``ready``). Step 0 is left out: its clock
    held that evaluation's own time in runs before the clock was read first (``run.json`` notes)."""
    frames = []
    for arm, spec in manifest["arms"].items():
        g = ema_curve(run / arm).query("step > 0")
        frames.append(g.assign(arm=arm, flags=_decimal(spec["flags"]), recipe=spec.get("recipe_default", ""),
                               wall=g["seconds"] + _ready(run / arm / "stdout.txt"),
                               declared=not spec.get("after_reading", False)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["step", "loss", "seconds", "arm", "flags", "recipe", "wall", "declared"])


def records(curve: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per arm: the last step, held-out loss and training clock, and the first evaluation at or below ``target``: its step, the
    training clock and the wall time from the command's start, both less the judge's own evaluations (NaN: not
    reached); reached first, fastest first."""
    rows = []
    for arm, g in curve.groupby("arm", sort=False):
        hit, last = first_at(g, target), g.iloc[-1]
        rows.append({"arm": arm, "recipe": last["recipe"], "flags": last["flags"], "declared": last["declared"],
                     "steps": int(last["step"]), "final loss": last["loss"],
                     "clock at end (s)": last["seconds"],
                     "step at target": hit["step"].iloc[0] if len(hit) else float("nan"),
                     "clock at target (s)": hit["seconds"].iloc[0] if len(hit) else float("nan"),
                     "wall at target (s)": hit["wall"].iloc[0] if len(hit) else float("nan")})
    df = pd.DataFrame(rows)
    return df.sort_values(["wall at target (s)", "final loss"]).reset_index(drop=True) if len(df) else df


def fastest(run: Path, manifest: dict) -> pd.Series | None:
    """The ``records`` row of ``run``'s arm that reached its manifest's target first, None where none did."""
    rec = records(curves(run, manifest), manifest["target"]["heldout"]).dropna(subset=["wall at target (s)"])
    return rec.iloc[0] if len(rec) else None


def record_64(root: str | Path, gpus: list[str], declared: bool = False) -> tuple[str, Path, dict, pd.Series] | None:
    """The 64³ record: of every arm of the recipe A/B runs on ``gpus`` (only those declared before their run read any
    result: ``declared``), the one that reached its run's target soonest, with its GPU, run folder and manifest; None
    where no such arm got there."""
    found = [(g, run, m, r) for g, run, m in ab_runs(root, gpus)
             for _, r in records(curves(run, m), m["target"]["heldout"]).iterrows()
             if r["wall at target (s)"] > 0 and (r["declared"] or not declared)]
    return min(found, key=lambda f: f[3]["wall at target (s)"]) if found else None


def recipe_label(spec: dict) -> str:
    """How the tables name the recipe of a manifest's arm that carries no ``label``: its recipe then."""
    return f"the {spec.get('recipe_default', 'default')} recipe"


def shared_flags(flags: str) -> str:
    """An arm's flags without what leaves its training unchanged: its ``--seed``, and the post-hoc EMA's snapshots
    (``--posthoc-ema``, ``--posthoc-every``: extra averages saved beside the run, untimed). What the runs of one recipe
    on several seeds share."""
    return re.sub(r"\s*--(seed|posthoc-every) \d+|\s*--posthoc-ema( [\d.]+)+", "", flags).strip()


def same_update(a: str, b: str) -> bool:
    """Whether two arms' flags train one update: the same ``shared_flags`` but for how the global batch is split
    (``--nproc``, ``--grad-accum``: ranks or micro-batches) and a closing ``(…)`` note; the caller compares the batch."""
    def update(flags: str) -> str:
        return re.sub(r"\s*--(nproc|grad-accum) \d+|\s*\(.*\)$", "", shared_flags(flags)).strip()
    return update(a) == update(b)


def repeats(root: str | Path, gpus: list[str], flags: str, target: float) -> pd.DataFrame:
    """Every 64³ A/B arm of the recipe ``flags`` on any seed (``shared_flags``): its run, seed, whether it was declared,
    and its ``records`` row against ``target``; so a record is read beside the same recipe on other seeds."""
    rows = []
    for gpu, run, m in ab_runs(root, gpus):
        rec = records(curves(run, m), target)
        for _, r in rec[rec["flags"].map(shared_flags) == shared_flags(_decimal(flags))].iterrows():
            rows.append({**r, "seed": manifests.seed(r["flags"]), "run": f"{gpu}/{run.relative_to(Path(root) / gpu)}"})
    return pd.DataFrame(rows).sort_values("seed").reset_index(drop=True) if rows else pd.DataFrame(
        columns=["arm", "seed", "declared", "step at target", "wall at target (s)", "run"])


SAMPLE_COLUMNS = {"brain_corr": "in-brain r", "region_corr": "region r", "hist_w1": "W1", "background_gap": "background gap",
                  "background_seed_spread_max": "largest seed spread", "ssim_between_seeds": "SSIM between seeds"}


def samples(root: str | Path, gpus: list[str], size: int = 64) -> pd.DataFrame:
    """The samples of ``size``³ A/B arms that were judged (an ``anatomy_summary.csv`` in the arm's folder: DDPM 250 on
    the val masks from its ``best.pt``, chapter 14's measures), one row per arm, the template's row first, then chapter
    14's v runs at that size (the paper's recipe at the book's rate, and the plateau run) on the anatomy GPU."""
    rows, template = [], None
    for gpu, run, m in ab_runs(root, gpus, size):
        for arm, spec in m["arms"].items():
            path = run / arm / "anatomy_summary.csv"
            if not path.exists():
                continue
            s = pd.read_csv(path).set_index("run")
            template = s.loc["template"] if template is None else template
            r = s.drop(index=["real", "template"]).iloc[0]
            rows.append({"arm": arm, "flags": _decimal(spec["flags"]), "sampler": r.name, "step": int(r["step"]),
                         **{v: r[k] for k, v in SAMPLE_COLUMNS.items()},
                         "run": f"{gpu}/{run.relative_to(Path(root) / gpu)}"})
    cols = ["arm", "flags", "sampler", "step", *SAMPLE_COLUMNS.values(), "run"]
    from . import anatomy  # chapter 14's v runs at this size, DDPM 250 on val
    from ..sample.anatomy import TEMPLATE
    g = anatomy.anatomy_gpu(root, gpus)
    a = anatomy.load(root, g, "anatomy_summary")
    a = a[(a["recipe"] == "v") & (a["config"] == "fast") & (a["size"] == size) & (a["split"] == "val")]
    if template is None and (a["run"] == TEMPLATE).any():  # the same validation masks' template, measured with the runs
        template = a[a["run"] == TEMPLATE].iloc[-1]
    a = a[a["run"].str.startswith("ddpm250")]
    plateaus = {arm: spec for _, _, m in manifests.runs(root, manifests.PLATEAU, None) for arm, spec in m["arms"].items()}
    rows += [{"arm": r["name"], "flags": recipe_label(plateaus[r["name"]]) if r["name"] in plateaus else PAPER_AT_BOOK_RATE,
              "sampler": r["run"], "step": int(r["step"]), **{v: r[k] for k, v in SAMPLE_COLUMNS.items()},
              "run": f"{g}/anatomy"}
             for _, r in a.drop_duplicates("name", keep="last").iterrows()]
    if template is not None:
        rows.insert(0, {"arm": "template", **{v: template[k] for k, v in SAMPLE_COLUMNS.items()}})
    return pd.DataFrame(rows, columns=cols)


def meets_targets(judged: pd.DataFrame) -> pd.Series:
    """Per judged arm of ``samples`` (indexed by arm, its template's row among them): whether its samples meet chapter
    14's targets: background within ±``TARGET_GAP`` of the scans' with a seed spread ≤ ``TARGET_SPREAD``, W1 at or
    below the template's, in-brain r ≥ ``TARGET_R``."""
    from .anatomy import TARGET_GAP, TARGET_R, TARGET_SPREAD

    arms = judged.drop(index="template", errors="ignore")
    w1 = judged.loc["template", "W1"] if "template" in judged.index else float("nan")
    return ((arms["background gap"].abs() <= TARGET_GAP) & (arms["largest seed spread"] <= TARGET_SPREAD)
            & (arms["W1"] <= w1) & (arms["in-brain r"] >= TARGET_R))


def posthoc(root: str | Path, gpus: list[str]) -> pd.DataFrame:
    """Every width a recipe A/B or plateau run's arm rebuilt by ``medddpm posthoc-ema`` (its ``posthoc.csv``) beside the held-out loss
    of the EMA it trained with at the same step, and the difference (negative: the post-hoc EMA is lower)."""
    cols = ["arm", "σ_rel", "step", "snapshots", "held-out loss", "its EMA's", "difference", "run"]
    frames = [pd.read_csv(path).rename(columns={"sigma_rel": "σ_rel", "heldout_loss": "held-out loss"})
              .merge(ema_curve(path.parent)[["step", "loss"]].rename(columns={"loss": "its EMA's"}), on="step", how="left")
              .assign(arm=path.parent.name, run=f"{gpu}/{run.relative_to(Path(root) / gpu)}")
              for gpu, run, _ in manifests.runs(root, KIND, gpus) + manifests.runs(root, manifests.PLATEAU, gpus)
              for path in sorted(run.glob("*/posthoc.csv"))]
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)
    return out.assign(difference=out["held-out loss"] - out["its EMA's"])[cols]


def step_times(root: str | Path, gpus: list[str]) -> pd.DataFrame:
    """The 128³ step of each optimizer, timed apart from the arms by the newest 64³ A/B run on ``gpus`` that did (its
    ``step128/<optimizer>-timing.csv``): steady ms a step (``steady_ms``) and the run; empty where none did."""
    cols = ["optimizer", "ms a step", "run"]
    for gpu, run, _ in ab_runs(root, gpus):
        timed = sorted((run / "step128").glob("*-timing.csv"))
        if timed:
            return pd.DataFrame([{"optimizer": p.name.split("-")[0], "ms a step": steady_ms(pd.read_csv(p)),
                                  "run": f"{gpu}/{run.relative_to(Path(root) / gpu)}"} for p in timed], columns=cols)
    return pd.DataFrame(columns=cols)


TARGET_SHARE_64 = 0.5  # issue 75 at 64³ on one GPU: the target in at most half the wall of Med-DDPM's recipe


def _paper_wall(root: str | Path, gpu: str, steps: int) -> tuple[float, str]:
    """Med-DDPM's recipe's wall to ``steps`` on ``gpu``, estimated from the newest 64³ A/B arm there that runs Adam
    (flags without ``--optimizer``): its start-up (``ready`` and first step) plus ``steps`` at its steady step; NaN
    without one."""
    for _, run, m in ab_runs(root, [gpu]):
        for arm, spec in m["arms"].items():
            if "--optimizer" not in spec["flags"] and (run / arm / "timing.csv").exists():
                timing = pd.read_csv(run / arm / "timing.csv")
                ms = steady_ms(timing)
                return _ready(run / arm / "stdout.txt") + first_step_s(timing) + steps * ms / 1e3, f"{run.name}/{arm}: {ms:.1f} ms a step"
    return float("nan"), "no Adam arm"


def state_64(root: str | Path, gpus: list[str]) -> pd.DataFrame:
    """Chapter 17's 64³ table against issue 75's target on one GPU: Med-DDPM's recipe's steps to the target (chapter
    14's runs) and its wall estimated at Adam's step on the fastest declared arm's GPU (``_paper_wall``), then the
    fastest declared arm and the fastest arm of any A/B, each against half that wall."""
    cols = ["what", "measured", "target", "met", "from"]
    fastest_any, fastest_declared = record_64(root, gpus), record_64(root, gpus, declared=True)
    if fastest_any is None:
        return pd.DataFrame(columns=cols)
    g, run, m, _ = fastest_declared or fastest_any  # the GPU whose Adam step times Med-DDPM's recipe
    target = m["target"]["heldout"]
    paper = paper_recipe_steps(root, target)["step at target"].dropna()
    wall, how = _paper_wall(root, g, int(paper.min())) if len(paper) else (float("nan"), "")
    rows = [(f"Med-DDPM's recipe at 10⁻⁴: steps to held-out loss ≤ {target:g} (chapter 14's runs)",
             f"{int(paper.min()):,}–{int(paper.max()):,} steps in {len(paper)} runs" if len(paper) else "never", "", "",
             "anatomy/train/v-s*-fast"),
            (f"its wall to the fewest of those steps at Adam's step on the record's GPU ({how}), start-up included",
             f"{wall:.0f} s (an estimate)" if wall == wall else "—", "", "", f"{g}/recipe")]
    limit = TARGET_SHARE_64 * wall
    for what, (gg, rr, _, r) in [("the fastest declared arm", fastest_declared)] * bool(fastest_declared) + [
            ("the fastest arm of any A/B", fastest_any)]:
        rows.append((f"{what} ({r['flags']}; {provenance(r)})", f"{r['wall at target (s)']:.0f} s",
                     f"≤ {limit:.0f} s" if limit == limit else "—",
                     ("yes" if r["wall at target (s)"] <= limit else "no") if limit == limit else "—",
                     f"{gg}/{rr.relative_to(Path(root) / gg)}/{r['arm']}"))
    return pd.DataFrame(rows, columns=cols)


def newest(root: str | Path, gpus: list[str]) -> tuple[str, Path, dict] | None:
    """The newest recipe A/B run on ``gpus``, None where the store has none."""
    found = ab_runs(root, gpus)
    return found[0] if found else None


def ab_runs(root: str | Path, gpus: list[str] | None, size: int = 64) -> list[tuple[str, Path, dict]]:
    """The recipe A/B runs at ``size``³ on ``gpus``, newest first (``manifests.runs``; a manifest without a size is a
    64³ run, the first A/B's)."""
    return [r for r in manifests.runs(root, KIND, gpus) if r[2].get("size", 64) == size]


def paper_recipe_steps(root: str | Path, target: float, gpus: list[str] | None = None) -> pd.DataFrame:
    """The 64³ v runs of chapter 14 (the paper's recipe at the book's rate: Adam at a constant 1e-4, EMA 0.995; each
    GPU's ``anatomy/train/v-s*-fast``): per run, its last step and the first step at or below ``target`` (NaN: not
    reached)."""
    rows = []
    for path in sorted(Path(root).glob("*/anatomy/train/v-s*-fast/heldout.csv")):
        if gpus is not None and path.parts[-5] not in gpus:
            continue
        g = ema_curve(path.parent)
        hit = first_at(g, target)
        rows.append({"gpu": path.parts[-5], "run": path.parent.name, "steps": int(g["step"].max()),
                     "lowest loss": g["loss"].min(), "step at target": hit["step"].iloc[0] if len(hit) else float("nan")})
    return pd.DataFrame(rows, columns=["gpu", "run", "steps", "lowest loss", "step at target"])


def record_table(root: str | Path, gpus: list[str], target: float) -> pd.DataFrame:
    """The modded-nanogpt-style record table at 64³: one row per recipe that held the record, the paper's first (its
    chapter-14 runs: steps only, they ran on another GPU), then each recipe A/B run's fastest arm to ``target``."""
    rows = []
    paper = paper_recipe_steps(root, target, gpus=None)
    hit = paper["step at target"].dropna()
    if len(hit):
        first = paper.loc[hit.idxmin()]
        rows.append({"date": "", "change": "Med-DDPM's recipe at the book's rate (Adam at a constant 10⁻⁴, EMA 0.995)",
                     "steps to target": int(first["step at target"]), "wall to target (s)": float("nan"),
                     "GPUs": gpu_label(first["gpu"]), "run": f"{first['gpu']}/anatomy/train/{first['run']}"})
    for gpu, run, m in reversed(ab_runs(root, gpus)):
        best = fastest(run, m)
        if best is not None:
            rows.append({"date": m["date"], "change": f"{best['arm']}: {best['flags']} ({provenance(best)})",
                         "steps to target": int(best["step at target"]), "wall to target (s)": best["wall at target (s)"],
                         "GPUs": gpu_label(gpu), "run": f"{gpu}/{run.relative_to(Path(root) / gpu)}"})
    return pd.DataFrame(rows, columns=["date", "change", "steps to target", "wall to target (s)", "GPUs", "run"])


def gpu_label(slug: str) -> str:
    """One GPU of a store folder, by its readers' name."""
    return f"1 × {gpu_name(slug)}"


PAPER_AT_BOOK_RATE = "Med-DDPM's at 10⁻⁴"  # the recipe of chapter 14's runs (Adam at a constant rate, EMA 0.995)


def steady_ms(timing: pd.DataFrame, first: int = 1, last: float = float("inf")) -> float:
    """The steady step in ms: the median of ``timing.csv``'s read-back intervals from step ``first`` to ``last`` (by
    default every interval after the first step, as ``train`` prints it), so that minutes of steps compare runs whatever
    their start-up, evaluations and stalls (``train.timing.phase_intervals``)."""
    return float(phase_intervals(timing, first, last).median())


def first_step_s(timing: pd.DataFrame) -> float:
    """How long a run's first step took in s: ``timing.csv``'s interval from step 0 (compilation, autotuning, the CUDA
    graph's capture); NaN where it kept none."""
    first = timing.loc[timing["step_from"] == 0, "ms_per_step"]
    return float(first.iloc[0]) / 1e3 if len(first) else float("nan")


def step_minutes(steps: pd.Series, timing: pd.DataFrame, patch_steps: int = 0) -> tuple[pd.Series, float]:
    """Minutes of steps at each of ``steps``, and the whole-volume step in ms: each phase of a curriculum (its
    ``patch_steps`` on patches, then whole volumes) at its own steady step (``steady_ms``), one phase without one."""
    if not patch_steps:
        ms = steady_ms(timing)
        return steps * ms / 60_000, ms
    patch, whole = steady_ms(timing, 1, patch_steps), steady_ms(timing, patch_steps + 1)
    return (steps.clip(upper=patch_steps) * patch + (steps - patch_steps).clip(lower=0) * whole) / 60_000, whole


def _ranks(stdout: Path) -> int:
    found = re.search(r"on (\d+) ranks", stdout.read_text()) if stdout.exists() else None
    return int(found.group(1)) if found else 1


def big_curves(root: str | Path, gpus: list[str] | None = None, size: int = 128) -> pd.DataFrame:
    """Every v run at ``size``³ (chapter 14's ``anatomy/train/v-s*-fast-<size>``, each arm of a ``recipe-plateau``
    manifest and of a ``size``³ recipe A/B, read from its own folder): per evaluation, the EMA's held-out loss, the
    step, the minutes of steps at the run's steady step (``step_minutes``: each phase of a curriculum at its own) and,
    where ``heldout.csv`` keeps the training clock, the wall time from the command's start less the evaluations
    (``wall``, as at 64³: ``curves``), with the run's recipe (an arm's ``label``), GPUs, global batch (``batch``:
    ``manifests.global_batch`` of an arm, one a GPU for chapter 14's runs) and folder."""
    ours = {arm: (run / arm, {**spec, "date": m["date"]})
            for _, run, m in manifests.runs(root, manifests.PLATEAU, gpus) + ab_runs(root, gpus, size)
            for arm, spec in m["arms"].items()}
    theirs = {p.parent.name: (p.parent, None)
              for p in sorted(Path(root).glob(f"*/anatomy/train/v-s*-fast-{size}/heldout.csv"))
              if (gpus is None or p.parts[-5] in gpus) and p.parent.name not in ours}
    rows = []
    for name, (folder, spec) in sorted({**theirs, **{a: v for a, v in ours.items()
                                                     if a.endswith(f"-{size}") or "label" in v[1]}}.items()):
        h = ema_curve(folder)
        patched = int(manifests.flag(spec.get("flags", ""), "--patch-steps", "0")) if spec else 0
        minutes, ms = step_minutes(h["step"], pd.read_csv(folder / "timing.csv"), patched)
        stdout = next(iter(sorted(folder.glob("*stdout.txt"))), folder / "stdout.txt")
        recipe = PAPER_AT_BOOK_RATE if spec is None else spec.get("label", recipe_label(spec))
        n = _ranks(stdout)
        rows.append(h.assign(run=name, recipe=recipe, GPUs=n, batch=manifests.global_batch(spec) if spec else n,
                             minutes=minutes, ms=ms, wall=h["seconds"] + _ready(stdout), folder=folder.relative_to(Path(root)).as_posix(),
                             date=spec["date"] if spec else "", declared=not (spec or {}).get("after_reading", False)))
    cols = ["step", "loss", "run", "recipe", "GPUs", "batch", "minutes", "ms", "wall", "folder", "date", "declared"]
    return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)


def plateaus(root: str | Path, gpus: list[str]) -> list[dict]:
    """The newest ``recipe-plateau`` run on ``gpus`` per GPU count and global batch (its manifest's ``gpus``, its
    arm's ``manifests.global_batch``), most GPUs first: each its GPU folder, run folder and manifest, its arm's name,
    that arm's ``big_records`` row against the manifest's target (every 128³ run read, on whatever GPU folder, so the
    paper recipe's compare), the process's wall seconds to its checkpoint (``manifests.stage_seconds``), the target,
    under ``seeds`` the same for the older runs there of the same command on other seeds (``shared_flags``), and for a
    run that ``emulates`` more GPUs, under ``measured`` the run of its update on that many (``same_update``; None)."""
    found: dict[tuple[int, int], list[tuple[str, Path, dict]]] = {}
    for gpu, run, m in manifests.runs(root, manifests.PLATEAU, gpus):  # newest first
        (spec,) = m["arms"].values()
        found.setdefault((int(m.get("gpus", 4)), manifests.global_batch(spec)), []).append((gpu, run, m))
    curves, by_target = big_curves(root, None) if found else None, {}

    def one(gpu: str, run: Path, m: dict) -> dict:
        (name, spec), = m["arms"].items()
        target = m["target"]["heldout"]
        if target not in by_target:
            by_target[target] = big_records(curves, target).set_index("run")
        records = by_target[target]
        return {"gpu": gpu, "run": run, "manifest": m, "name": name, "target": target, "record": records.loc[name],
                "records": records, "wall": manifests.stage_seconds(run, *spec["stamps"])}

    def command(m: dict) -> str:
        return shared_flags(next(iter(m["arms"].values()))["flags"])

    out = [{**one(*key_runs[0]), "seeds": [one(*r) for r in key_runs[1:] if command(r[2]) == command(key_runs[0][2])]}
           for _, key_runs in sorted(found.items(), reverse=True)]

    def flags(p: dict) -> str:
        return p["manifest"]["arms"][p["name"]]["flags"]

    for p in out:
        k = p["manifest"].get("emulates")
        p["measured"] = next((q for q in out if k and "emulates" not in q["manifest"] and int(q["record"]["GPUs"]) == k
                              and q["record"]["global batch"] == p["record"]["global batch"]
                              and same_update(flags(p), flags(q))), None)
    return out


def plateau_target(root: str | Path, gpus: list[str]) -> float:
    """The held-out target of the newest ``recipe-plateau`` run's manifest (NaN: none)."""
    found = manifests.runs(root, manifests.PLATEAU, gpus)
    return found[0][2]["target"]["heldout"] if found else float("nan")


def big_records(curve: pd.DataFrame, target: float, plateau: float = 0.01) -> pd.DataFrame:
    """Per run of ``big_curves``: its steps, last and lowest loss (``best.pt``'s), the first evaluation at or below ``target`` (step, minutes
    of steps; NaN: not reached) and whether it levelled (its loss fell by less than ``plateau`` between its last two
    evaluations, the book's rule); minutes are of steps at its steady step, the wall from the command's start less the
    evaluations where the run kept its clock."""
    rows = []
    for run, g in curve[curve["step"] > 0].groupby("run", sort=False):
        hit, last = first_at(g, target), g.iloc[-1]
        drop = (g["loss"].iloc[-2] - last["loss"]) / g["loss"].iloc[-2] if len(g) > 1 else float("nan")
        rows.append({"run": run, "recipe": last["recipe"], "GPUs": int(last["GPUs"]), "global batch": int(last["batch"]),
                     "steps": int(last["step"]),
                     "final loss": last["loss"], "lowest loss": g["loss"].min(),
                     "step at lowest": int(g.loc[g["loss"].idxmin(), "step"]),
                     "step at target": hit["step"].iloc[0] if len(hit) else float("nan"),
                     "minutes at target": hit["minutes"].iloc[0] if len(hit) else float("nan"),
                     "wall at target (min)": hit["wall"].iloc[0] / 60 if len(hit) else float("nan"),
                     "minutes of steps": last["minutes"], "ms a step": last["ms"],
                     "levelled": "yes" if drop < plateau else "no", "folder": last["folder"], "date": last["date"],
                     "declared": last["declared"]})
    cols = ["run", "recipe", "GPUs", "global batch", "steps", "final loss", "lowest loss", "step at lowest", "step at target",
            "minutes at target", "wall at target (min)",
            "minutes of steps", "ms a step", "levelled", "folder", "date", "declared"]
    return pd.DataFrame(rows, columns=cols)


def _reached(records: pd.DataFrame, gpus: int) -> pd.DataFrame:
    """The ``big_records`` rows of runs on ``gpus`` GPUs, one volume a GPU (a larger global batch on fewer GPUs
    emulates more: a projection, not a record), that reached the target, with their ``to target`` minutes: from
    ``train``'s start less the evaluations, or minutes of steps for a run that kept no clock."""
    mine = records[(records["GPUs"] == gpus) & (records["global batch"] == gpus) & records["step at target"].notna()]
    return mine.assign(**{"to target": mine["wall at target (min)"].fillna(mine["minutes at target"])})


def record_128(records: pd.DataFrame, gpus: int) -> pd.Series:
    """The ``big_records`` row (indexed by run) of the run on ``gpus`` GPUs that reached the target soonest
    (``_reached``); the first run on them where none did."""
    mine = _reached(records, gpus)
    return mine.loc[mine["to target"].idxmin()] if len(mine) else records[records["GPUs"] == gpus].iloc[0]


def records_128(records: pd.DataFrame, gpus: int) -> pd.DataFrame:
    """The modded-nanogpt-style record table at the paper's size on ``gpus`` GPUs: in date order (chapter 14's
    undated runs first, a day's runs slowest first), each ``big_records`` run that reached the target sooner than every
    run before it (``_reached``); a day's runs of one change (its seeds) are one row, their fastest, with how many
    reached the target (``seeds``)."""
    cols = ["date", "change", "minutes to target", "steps to target", "seeds", "GPUs", "run"]
    mine = _reached(records, gpus)
    seeds = mine.groupby(["date", "recipe"])["run"].transform("size")
    mine = mine.assign(seeds=seeds).sort_values("to target").drop_duplicates(["date", "recipe"])
    rows, best = [], float("inf")
    for _, r in mine.sort_values(["date", "to target"], ascending=[True, False]).iterrows():
        if r["to target"] < best:
            best = r["to target"]
            rows.append({"date": r["date"], "change": r["recipe"], "minutes to target": best,
                         "steps to target": int(r["step at target"]), "seeds": int(r["seeds"]), "GPUs": gpus,
                         "run": r["folder"]})
    return pd.DataFrame(rows, columns=cols)


def projected_minutes(manifest: dict, steps: float) -> float:
    """Minutes of ``steps`` at the step an emulating run's manifest projects with (``target.projection_ms``: what
    the GPUs it ``emulates`` would take a step), never a measurement."""
    return steps * manifest["target"]["projection_ms"] / 60_000


TARGET_MINUTES_4 = (4.0, 12.0)  # issue 75 on 4 GPUs: reach the target, then the plateau, process start to checkpoint
TARGET_MINUTES = {4: TARGET_MINUTES_4, 2: tuple(2 * m for m in TARGET_MINUTES_4)}  # doubled on 2 (where no 4 are
# lent); none on 1


def _minutes(measured: float, gpus: int, which: int, ok: bool = True) -> tuple[str, object]:
    """The target and verdict of a time row of ``plateau_state`` on ``gpus`` GPUs (``TARGET_MINUTES[gpus][which]``;
    "—" where the issue sets none)."""
    if gpus not in TARGET_MINUTES:
        return "— (none on this many GPUs)", "—"
    limit = TARGET_MINUTES[gpus][which]
    return f"≤ {limit:g} min", measured <= limit and ok


def _plateau_rows(root: str | Path, gpus: list[str], p: dict, seed: bool = False) -> list[tuple]:
    """``plateau_state``'s rows of one plateau run (``plateaus``): its time to the target is the fastest run's on its
    GPUs (one volume a GPU: ``record_128``), or its own for another ``seed`` of the newest run's command and for a run
    of more volumes a GPU."""
    from . import anatomy, equivalence

    m, name, mine, wall = p["manifest"], p["name"], p["record"], p["wall"]
    n = int(mine["GPUs"])
    on = count(n, "GPU")
    here = f"{p['gpu']}/{p['run'].relative_to(Path(root) / p['gpu'])}"
    own = seed or int(mine["global batch"]) != n
    best = mine if own else record_128(p["records"], n)
    which = ("this seed" if seed else "this run") if own else f"the fastest run on {on}"
    if "emulates" in m:  # a larger global batch on fewer GPUs: minutes projected at the manifest's step, not measured
        k, ms = m["emulates"], m["target"]["projection_ms"]
        projected = [(steps, projected_minutes(m, steps)) for steps in (mine["step at target"], mine["steps"])]
        rows = [(f"held-out loss ≤ {m['target']['heldout']:g} at global batch {mine['global batch']} on {on} ({mine['recipe']}), projected "
                 f"on {k} GPUs at {ms:g} ms a step", f"{projected[0][1]:.1f} min of steps ({projected[0][0]:,.0f} steps; a "
                 "projection)", *_minutes(projected[0][1], k, 0)),
                (f"its {mine['steps']:,} steps (the cosine's end and checkpoint), projected on {k} GPUs the same way",
                 f"{projected[1][1]:.1f} min of steps (levelled: {mine['levelled']}; a projection)",
                 *_minutes(projected[1][1], k, 1, mine["levelled"] == "yes"))]
        rows = [(what, measured, target, ok if ok == "—" else f"projected {'yes' if ok else 'no'}", here)
                for what, measured, target, ok in rows]
    else:
        rows = [(f"held-out loss ≤ {m['target']['heldout']:g} (the target), {which} ({best['recipe']})",
                 f"{best['wall at target (min)']:.1f} min from `train`'s start, evaluations left out "
                 f"({best['step at target']:,.0f} steps, {best['minutes at target']:.1f} min of steps)",
                 *_minutes(best["wall at target (min)"], n, 0), best["folder"]),
                (f"the plateau (under 1 % between the last two evaluations), process start to checkpoint, warm cache, {on} "
                 f"({mine['recipe']})", f"{wall / 60:.1f} min ({mine['steps']:,} steps, levelled: {mine['levelled']})",
                 *_minutes(wall / 60, n, 1, mine["levelled"] == "yes"), here)]
    rows += [(f"held-out loss of its checkpoint (best.pt: the lowest, at step {mine['step at lowest']:,})",
             f"{mine['lowest loss']:.4f}", f"< {m['target']['best_before']:g}",
             mine["lowest loss"] < m["target"]["best_before"], here)]
    g = anatomy.anatomy_gpu(root, gpus)
    s = anatomy.load(root, g, "anatomy_summary")
    s = s[(s["name"] == name) & (s["split"] == "val")].set_index("run")
    if anatomy.LARGE_RUN in s.index:
        r, t = s.loc[anatomy.LARGE_RUN], s.loc["template"]
        at = f"{g}/anatomy/anatomy_summary.csv"
        rows += [("background, DDPM 250 − scan", f"{r['background_gap']:+.3f}", f"within ±{anatomy.TARGET_GAP:g}",
                  abs(r["background_gap"]) <= anatomy.TARGET_GAP, at),
                 ("largest background spread between seeds", f"{r['background_seed_spread_max']:.3f}",
                  f"≤ {anatomy.TARGET_SPREAD:g}", r["background_seed_spread_max"] <= anatomy.TARGET_SPREAD, at),
                 ("W1 to the scans' intensities", f"{r['hist_w1']:.4f}", f"≤ the template's {t['hist_w1']:.4f}",
                  r["hist_w1"] <= t["hist_w1"], at),
                 ("in-brain r", f"{r['brain_corr']:.3f}", f"≥ {anatomy.TARGET_R:g}", r["brain_corr"] >= anatomy.TARGET_R, at)]
    u = anatomy.utility(root, g)
    u = u[u["run"] == name].set_index("segmenter trained on")
    if {"real", "synthetic"} <= set(u.index):
        share = u.loc["synthetic", "Dice"] / u.loc["real", "Dice"]
        rows.append(("segmentation Dice, synthetic-trained against real-trained", f"{100 * share:.1f} %",
                     f"≥ {100 * anatomy.TARGET_UTILITY:g} %", share >= anatomy.TARGET_UTILITY, f"{g}/anatomy/anatomy_utility.csv"))
    eg = equivalence.equivalence_gpu(root, gpus)
    both = equivalence.under_both_rules(root, eg)
    v = both[(both["checkpoint"] == name) & (both["run"] == equivalence.label(equivalence.candidate_run()))]
    if len(v):
        rows.append((f"sampler gate, non-inferiority: {equivalence.label(equivalence.candidate_run())}",
                     v["non-inferiority"].iloc[0], "pass", v["non-inferiority"].iloc[0] == "pass",
                     f"{eg}/equivalence/samples.csv"))
    return [(name, *r) for r in rows]


def plateau_state(root: str | Path, gpus: list[str]) -> pd.DataFrame:
    """Chapter 17's 128³ table: the newest ``recipe-plateau`` run per GPU count and global batch, and the same command's
    runs there on other seeds (``plateaus``), against issue 75's targets, each row measured (its time to the target,
    its process wall to the checkpoint, its checkpoint's loss, the anatomy of DDPM 250's samples, the segmentation
    utility and the sampler gate's verdict on the chain), with where it comes from."""
    rows = [r for p in plateaus(root, gpus) for q, seed in ((p, False), *((q, True) for q in p["seeds"]))
            for r in _plateau_rows(root, gpus, q, seed)]
    out = pd.DataFrame(rows, columns=["run", "what", "measured", "target", "met", "from"])
    return out.assign(met=out["met"].map(lambda v: {True: "yes", False: "no"}.get(v, v)))


RECIPE_FLAGS = {"--lr", "--lr-warmup", "--lr-decay", "--lr-final", "--min-snr-gamma", "--ema-decay", "--ema-start",
                "--adam-betas", "--patch-size", "--patch-steps", "--batch", "--recipe"}  # train's flags that change a recipe


def by_default(command: str) -> bool:
    """Whether a ``train`` command ran the default recipe of its day: it gives none of ``RECIPE_FLAGS`` and no
    ``--optimizer`` (a timed row keeps its command, not the recipe that command resolved to)."""
    return not (RECIPE_FLAGS | {"--optimizer"}) & set(command.split())


def runs_default(spec: dict) -> bool:
    """Whether a manifest's arm trained ``train``'s default recipe as it is today: its recipe then
    (``recipe_default``) with its ``--optimizer``, if any, has the values of ``DEFAULT_RECIPE``, and no other flag
    changed them (its global batch aside: ``manifests.global_batch``)."""
    if RECIPE_FLAGS & set(spec["flags"].split()) or "recipe_default" not in spec:
        return False
    given = recipe_config(spec["recipe_default"], optimizer=manifests.flag(spec["flags"], "--optimizer"))
    default = recipe_config(DEFAULT_RECIPE)
    return all(getattr(given, f) == getattr(default, f) for f in RECIPE_FIELDS)


def default_seeds(root: str | Path, gpus: list[str], target: float) -> pd.DataFrame:
    """Every 64³ run of ``train``'s default recipe (``runs_default``; one volume a step, as ``recipe_ab.sh`` runs every
    arm: a recipe A/B arm, or a
    ``recipe-plateau`` run's 64³ ``confirm`` runs): its seed, steps, final held-out loss and the first step at or below
    ``target`` (NaN: not reached), so one seed's record reads beside the others."""
    rows = []
    for gpu, run, m in ab_runs(root, gpus) + manifests.runs(root, manifests.PLATEAU, gpus):
        arms = m["arms"] if m["kind"] == KIND else {k: v for k, v in m.get("confirm", {}).items() if isinstance(v, dict)}
        for arm, spec in arms.items():
            if not runs_default(spec):
                continue
            g = ema_curve(run / arm).query("step > 0")
            hit = first_at(g, target)
            rows.append({"run": f"{gpu}/{run.relative_to(Path(root) / gpu)}/{arm}",
                         "seed": manifests.seed(spec["flags"]),
                         "steps": int(g["step"].max()), "final loss": g["loss"].iloc[-1],
                         "step at target": hit["step"].iloc[0] if len(hit) else float("nan")})
    return pd.DataFrame(rows, columns=["run", "seed", "steps", "final loss", "step at target"])
