"""``minigpt compare``: runs side by side, variants averaged over seeds, with the seed noise said.

Bits per byte: the final val loss in bits over the val split's UTF-8 bytes per token. Seed noise: a difference
of means exceeds it past twice its standard error sqrt(s1²/n1 + s2²/n2) (Welch; about a 95% two-sided test).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from pydantic import BaseModel, ValidationError

from ..accounting import params
from ..config.schema import Config, load_config
from ..errors import MinigptError, refuse
from ..fileio import atomic_write_set
from ..run import folder as runs
from ..run.metrics import METRICS, read_events

_MESSAGES = {
    "edited": "note: {path} differs from its checkpoint's config.yaml; compared as the checkpoint records it (the "
              "config the weights were trained with)",
    "run_output": "--output {path} is a run folder, which holds that run's record; pass another --output",
    "not_run": "{path!r} is neither a run folder (config.yaml and metrics.jsonl) nor a folder of runs",
    "no_evals": "{path} has no eval in metrics.jsonl yet; train it until its first eval",
    "metric": "--metric val_loss: the runs trained on different corpora, whose val losses do not compare; "
              "use --metric bits_per_byte",
    "metric_name": "--metric {metric!r}: use val_loss or bits_per_byte",
    "target": "--target {target}: give a positive loss (or bits per byte), e.g. --target 1.9",
    "unfinished": "note: {variant}'s seeds ended at different steps ({steps}): a run is unfinished or stopped "
                  "early, and its mean mixes them",
    "corpora": "note: the runs trained on different corpora: val losses do not compare, so only bits per byte "
               "is shown",
    "tokenizers": "note: the variants use different tokenizers: val loss is per token of each, so compare bits "
                  "per byte",
    "no_bpb": "note: no bits per byte for {run}: {why}",
    "users": "{path} is not a summary minigpt wrote (its summary.json is not one: {why}); pass another --output",
}
#: The files a summary writes; summary.json is also what proves an earlier summary minigpt's.
SUMMARY_FILES = ("summary.md", "summary.csv", "summary.json", "summary.png")

#: Config keys that never make two runs different variants.
_IGNORED = {"seed", "name", "train.out_dir", "data.fingerprint", "tokenizer.path"}


Model = TypeVar("Model", bound=BaseModel)


def _why(exc: OSError | ValidationError) -> str:
    """What is wrong with a file: the OS's reason, or the first key its schema refuses, in words."""
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    err = exc.errors()[0]
    loc, msg = ".".join(map(str, err["loc"])), err["msg"].removeprefix("Value error, ")
    msg = "the top level must be a mapping" if err["type"] == "model_type" and not loc else msg[0].lower() + msg[1:]
    return f"{loc}: {msg}" if loc else msg


def read_model(schema: type[Model], source: Path | Any, what: str, **fields: Any) -> Model:
    """``source`` (a JSON file, or parsed data) read through ``schema``; a :class:`MinigptError` from ``what``."""
    try:
        return schema.model_validate_json(source.read_bytes()) if isinstance(source, Path) else \
            schema.model_validate(source)
    except (OSError, ValidationError) as exc:  # unreadable, or not what the schema says
        raise MinigptError(what.format(why=_why(exc), **fields)) from None


@dataclass
class RunRecord:
    """One run folder's config and curves."""

    path: Path
    cfg: Config
    evals: list[dict]  # metrics.jsonl eval events: step, elapsed_s, val_loss
    rates: list[float]  # tokens/s of its train events
    note: Optional[str] = None  # the run's config.yaml differs from its checkpoint's (which is read)

    @property
    def final(self) -> float:
        return self.evals[-1]["val_loss"]


def read_run(path: Path) -> RunRecord:
    """A run folder as a :class:`RunRecord`; a :class:`MinigptError` when it has no eval yet."""
    events = read_events(path / METRICS)  # none when the file is absent
    evals = [e for e in events if e["event"] == "eval"]
    if not evals:
        raise MinigptError(_MESSAGES["no_evals"].format(path=path))
    rates = [e["tokens_per_sec"] for e in events if e.get("tokens_per_sec")]
    cfg = load_config(path / runs.CONFIG)
    if not runs.has_checkpoint(path):
        return RunRecord(path, cfg, evals, rates)
    from ..run.checkpoint import saved_config  # torch: only for a run with weights

    which = runs.LAST if runs.has_weights(runs.checkpoint_dir(path, runs.LAST)) else runs.BEST
    saved = saved_config(runs.checkpoint_dir(path, which))  # verified: the record of what the weights are
    differs = saved.to_dict() != cfg.to_dict()
    note = _MESSAGES["edited"].format(path=path / runs.CONFIG) if differs else None
    return RunRecord(path, saved, evals, rates, note)


def expand(paths: list[Path]) -> list[Path]:
    """Run folders: each path itself when it is one, else those inside it; a :class:`MinigptError` if neither."""
    out = []
    for p in paths:
        if (p / runs.CONFIG).is_file():
            out.append(p)
            continue
        inside = sorted(q for q in p.iterdir() if (q / runs.CONFIG).is_file()) if p.is_dir() else []
        if not inside:
            raise MinigptError(_MESSAGES["not_run"].format(path=str(p)))
        out += inside
    return out


def _mean_sd(values: list[float]) -> tuple[float, Optional[float]]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def _bytes_per_token(cfg: Config, run_dir: Path, cache: dict, notes: list[str]) -> Optional[float]:
    """UTF-8 bytes per token of the run's val split; None, with a note saying why, when it cannot be read."""
    from ..data.pipeline import run_corpus_config
    from ..eval.evaluate import split_tokens, text_size
    from ..tokenizer.kinds import load_run_tokenizer

    try:
        tok = load_run_tokenizer(run_dir, cfg)
        key = (cfg.data.fingerprint, tok.fingerprint())
        if key not in cache:
            val = split_tokens(run_corpus_config(cfg, run_dir), tok, "val", run_dir)
            cache[key] = text_size(tok, val)[0] / len(val)
        return cache[key]
    except MinigptError as exc:
        notes.append(_MESSAGES["no_bpb"].format(run=run_dir, why=exc))
        return None


@dataclass
class Variant:
    """Runs of one config at several seeds, and what the table says of them."""

    name: str
    runs: list[RunRecord] = field(default_factory=list)
    row: dict[str, Any] = field(default_factory=dict)


def _at_time(r: RunRecord, t: float) -> float:
    """The run's val loss at its last eval at or before ``t`` seconds (its first eval when none is)."""
    before = [e for e in r.evals if e["elapsed_s"] <= t + 1e-9]
    return (before or r.evals[:1])[-1]["val_loss"]


def _fmt(mean: Optional[float], sd: Optional[float], digits: int = 4) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


def summarize(run_dirs: list[Path], *, out: Optional[Path] = None, target: Optional[float] = None,
              variants: Optional[dict[str, str]] = None, metric: Optional[str] = None,
              echo: Callable[[str], None] = lambda m: None) -> dict:
    """Compare runs (the README's columns), writing the summary files into ``out`` when given; ``variants``
    (folder name -> variant) defaults to the name less ``-s<seed>``. Refusals: :data:`_MESSAGES`."""
    records = [read_run(p) for p in dict.fromkeys(Path(d).resolve() for d in run_dirs)]  # each run once
    groups: dict[str, Variant] = {}
    for r in records:
        key = json.dumps({k: v for k, v in r.cfg.flat().items() if k not in _IGNORED}, sort_keys=True)
        name = (variants or {}).get(r.path.name) or re.sub(r"-s\d+$", "", r.path.name)
        if key not in groups and name in {v.name for v in groups.values()}:  # the same name, another config
            name = f"{r.path.parent.name}/{name}"
        groups.setdefault(key, Variant(name)).runs.append(r)
    flats = {k: v.runs[0].cfg.flat() for k, v in groups.items()}
    columns = sorted(k for k in set().union(*flats.values()) - _IGNORED
                     if len({json.dumps(f.get(k)) for f in flats.values()}) > 1)
    same_corpus = len({r.cfg.data.fingerprint for r in records}) == 1
    refuse([(metric not in (None, "val_loss", "bits_per_byte"), "metric_name"),
            (target is not None and not (math.isfinite(target) and target > 0), "target"),
            (metric == "val_loss" and not same_corpus, "metric")], _MESSAGES, metric=metric, target=target)
    notes = [] if same_corpus else [_MESSAGES["corpora"]]
    if len({(r.cfg.tokenizer.kind, r.cfg.tokenizer.vocab_size) for r in records}) > 1 and same_corpus:
        notes.append(_MESSAGES["tokenizers"])
    metric = metric or ("val_loss" if not notes else "bits_per_byte")
    notes += [r.note for r in records if r.note]  # after the metric is chosen: these do not change it
    equal_time = min(r.evals[-1]["elapsed_s"] for r in records)
    cache: dict = {}
    bpt = {r.path: _bytes_per_token(r.cfg, r.path, cache, notes) for r in records}
    # The target is in the metric's unit: nats per token, or bits per byte (a loss / ln 2 / bytes per token).
    scale = {r.path: 1.0 if metric == "val_loss" else (1 / math.log(2) / bpt[r.path] if bpt[r.path] else math.inf)
             for r in records}
    if target is None:  # the worst run's final value: every run reaches it
        target = max((r.final * scale[r.path] for r in records if scale[r.path] < math.inf), default=math.inf)
    for key, v in groups.items():
        cfg = v.runs[0].cfg
        pc = params.count(cfg.model)
        per_token = params.flops(cfg.model, cfg.model.block_size)["train_with_lm_head"]
        bpb = [r.final / math.log(2) / bpt[r.path] for r in v.runs if bpt[r.path]]
        reached = [next((e["elapsed_s"] for e in r.evals if e["val_loss"] * scale[r.path] <= target), None)
                   for r in v.runs]
        v.row = {"variant": v.name, **{c: flats[key].get(c) for c in columns}, "seeds": len(v.runs),
                 "params": pc.total, "params_non_embedding": pc.non_embedding, "flops_per_token": per_token,
                 "tokens_per_sec": statistics.fmean(statistics.median(r.rates) for r in v.runs if r.rates)
                 if any(r.rates for r in v.runs) else None,
                 "steps": statistics.fmean(r.evals[-1]["step"] for r in v.runs)}
        stats = {"final_val": [r.final for r in v.runs],
                 "best_val": [min(e["val_loss"] for e in r.evals) for r in v.runs],
                 "val_at_equal_time": [_at_time(r, equal_time) for r in v.runs], "bits_per_byte": bpb}
        for name, values in stats.items():
            if name != "bits_per_byte" and not same_corpus:
                continue
            mean, sd = _mean_sd(values) if values else (None, None)
            v.row[name], v.row[f"{name}_sd"], v.row[f"{name}_all"] = mean, sd, values
        ends = sorted({r.evals[-1]["step"] for r in v.runs})
        if len(ends) > 1:
            notes.append(_MESSAGES["unfinished"].format(variant=v.name, steps=", ".join(map(str, ends))))
        done = [t for t in reached if t is not None]
        v.row["time_to_target_s"] = statistics.fmean(done) if len(done) == len(reached) else None
        v.row["seeds_reached_target"] = len(done)  # of "seeds"; the table writes "1/3"
    ordered = list(groups.values())
    result = {"columns": columns, "rows": [v.row for v in ordered], "notes": notes, "target": target,
              "equal_time_s": equal_time, "metric": metric,
              "sentences": _sentences(ordered, "final_val" if metric == "val_loss" else "bits_per_byte")}
    if out is not None:
        _write(result, ordered, Path(out))
    return result


def _sentences(variants: list[Variant], stat: str) -> list[str]:
    """One sentence per pair of variants (each against the best when there are more than five)."""
    unit = "nats" if stat == "final_val" else "bits per byte"
    have = [v for v in variants if v.row.get(stat) is not None]
    if len(have) > 5:
        best = min(have, key=lambda v: v.row[stat])
        pairs = [(best, v) for v in have if v is not best]
    else:
        pairs = [(a, b) for i, a in enumerate(have) for b in have[i + 1:]]
    out = []
    for a, b in pairs:
        xa, xb = a.row[f"{stat}_all"], b.row[f"{stat}_all"]
        diff = statistics.fmean(xa) - statistics.fmean(xb)
        lower, higher = (a, b) if diff < 0 else (b, a)
        if len(xa) < 2 or len(xb) < 2:
            out.append(f"{lower.name} is {abs(diff):.4f} {unit} below {higher.name}; with one seed there is no "
                       f"noise estimate")
            continue
        se = math.sqrt(statistics.variance(xa) / len(xa) + statistics.variance(xb) / len(xb))
        verdict = "exceeds" if abs(diff) > 2 * se else "is within"
        out.append(f"{lower.name} is {abs(diff):.4f} {unit} below {higher.name}; the difference {verdict} the "
                   f"seed noise (2 × standard error = {2 * se:.4f})")
    return out


def _spec(result: dict) -> list[tuple[str, list[str], Callable[[dict], str]]]:
    """The summary's columns: the table's header, the CSV keys behind it, and its cell as text."""
    spec = [("variant", ["variant"], lambda r: r["variant"]),
            *((c, [c], lambda r, c=c: value_text(r[c])) for c in result["columns"]),
            ("seeds", ["seeds"], lambda r: str(r["seeds"])),
            ("params", ["params"], lambda r: f"{r['params']:,}"),
            ("non-emb", ["params_non_embedding"], lambda r: f"{r['params_non_embedding']:,}"),
            ("FLOPs/token", ["flops_per_token"], lambda r: f"{r['flops_per_token']:,}"),
            ("tokens/s", ["tokens_per_sec"], lambda r: f"{r['tokens_per_sec']:,.0f}" if r["tokens_per_sec"] else "n/a"),
            ("steps", ["steps"], lambda r: f"{r['steps']:.0f}")]
    stats = [("val bits/byte", "bits_per_byte")]
    if "final_val" in (result["rows"][0] if result["rows"] else {}):
        stats[:0] = [("final val", "final_val"), ("best val", "best_val"),
                     (f"val @ {result['equal_time_s']:.0f}s", "val_at_equal_time")]
    spec += [(head, [k, f"{k}_sd"], lambda r, k=k: _fmt(r[k], r[f"{k}_sd"])) for head, k in stats]
    unit = "nats" if result["metric"] == "val_loss" else "bits/byte"
    spec.append((f"s to {result['target']:.3f} {unit}", ["time_to_target_s", "seeds_reached_target"],
                 lambda r: f"{r['time_to_target_s']:.1f}" if r["time_to_target_s"] is not None
                 else f"not reached ({r['seeds_reached_target']}/{r['seeds']})"))
    return spec


def _csv_rows(result: dict) -> list[list[Any]]:
    """summary.csv's rows: the JSON rows' names and plain values, standard deviations in columns of their own."""
    keys = [k for _, ks, _ in _spec(result) for k in ks]
    return [keys, *([_plain(r.get(k)) for k in keys] for r in result["rows"])]


def _plain(value: Any) -> Any:
    """A CSV cell: a number or text as it is, nothing as an empty cell, anything else as JSON (``true``)."""
    if value is None:
        return ""
    return value if isinstance(value, (int, float, str)) and not isinstance(value, bool) else json.dumps(value)


def value_text(value: Any) -> str:
    """A config value as text: text as it is, anything else as JSON, which ``--set`` reads back."""
    return value if isinstance(value, str) else json.dumps(value)


#: How a table cell writes what would break a Markdown row: a ``|`` ends the cell, a line break the row.
_CELL_ESCAPES = {"\\": "\\\\", "|": "\\|", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell: :data:`_CELL_ESCAPES`, other unprintables as Python writes them."""
    return "".join(_CELL_ESCAPES.get(c) or (c if c.isprintable() else repr(c)[1:-1]) for c in text)


def format_summary(result: dict) -> str:
    """The Markdown table (every cell escaped by :func:`_cell`), then the notes and the pairwise sentences."""
    spec = _spec(result)
    rows = [[h for h, _, _ in spec], *([f(r) for *_, f in spec] for r in result["rows"])]
    lines = ["| " + " | ".join(map(_cell, row)) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(spec))
    lines += [""] + result["notes"] + [f"- {s}" for s in result["sentences"]]
    return "\n".join(lines).rstrip() + "\n"


def _write(result: dict, variants: list[Variant], out: Path) -> None:
    """summary.md, .csv, .json and .png, renamed into place as a set: an interrupt leaves the previous set or none."""
    _check_ours(out)
    out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    csv.writer(buf).writerows(_csv_rows(result))
    texts = {"summary.md": format_summary(result), "summary.csv": buf.getvalue(),
             "summary.json": json.dumps(result, indent=1) + "\n"}
    files = {out / name: text.encode("utf-8") for name, text in texts.items()}
    files[out / "summary.png"] = _plot(variants)
    atomic_write_set(files)


class _Summary(BaseModel):
    """What proves a summary.json minigpt's: the keys :func:`summarize` writes."""

    columns: list
    rows: list
    metric: str


def _check_ours(out: Path) -> None:
    """Refuse a run folder as ``out``, and summary files in ``out`` that are not an earlier summary."""
    refuse([((out / runs.CONFIG).is_file() or runs.made_here(out), "run_output")], _MESSAGES, path=out)
    if any(os.path.lexists(out / name) for name in SUMMARY_FILES):
        read_model(_Summary, out / "summary.json", _MESSAGES["users"], path=out)


def _plot(variants: list[Variant]) -> bytes:
    """Val loss against steps, wall time and training FLOPs: each variant's mean over seeds, its seeds' range shaded."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.13, top=0.9, wspace=0.2)
    axes = fig.subplots(1, 3, sharey=True)
    for i, v in enumerate(variants):
        cfg = v.runs[0].cfg
        per_step = cfg.train.batch_size * cfg.train.grad_accum_steps * cfg.model.block_size * v.row["flops_per_token"]
        steps = sorted(set.intersection(*({e["step"] for e in r.evals} for r in v.runs)))
        at = [{e["step"]: e for e in r.evals} for r in v.runs]
        losses = [[a[s]["val_loss"] for a in at] for s in steps]
        mean = [statistics.fmean(x) for x in losses]
        xs = {"optimizer step": steps,
              "wall time (s, evals included)": [statistics.fmean(a[s]["elapsed_s"] for a in at) for s in steps],
              "training FLOPs": [s * per_step for s in steps]}
        for ax, (label, x) in zip(axes, xs.items()):
            ax.plot(x, mean, "o-", markersize=2, label=f"{v.name} ({len(v.runs)} seeds)", color=f"C{i % 10}")
            if len(v.runs) > 1:
                ax.fill_between(x, [min(l) for l in losses], [max(l) for l in losses], alpha=0.2, color=f"C{i % 10}")
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
    axes[0].set_ylabel("val loss (nats/token)")
    axes[0].legend(fontsize=8)
    fig.suptitle("validation loss: mean over seeds, shaded from the lowest to the highest seed")
    png = io.BytesIO()
    fig.savefig(png, format="png")
    return png.getvalue()
