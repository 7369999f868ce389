"""``minigpt compare``: runs side by side, variants averaged over seeds, the seed noise said.

Bits per byte: the final val loss in bits over the val split's UTF-8 bytes per token. Seed noise:
one test decides whether a difference of means exceeds it, Welch's t-test
(``scipy.stats.ttest_ind(equal_var=False)``) at p < :data:`.noise.ALPHA`; while it does not, the
seeds per variant that would bring it there (:func:`.noise.seeds_needed`). Runs of one config,
corpus and seed are repeats, not seeds: one is kept (:func:`_distinct`). A study's trials
(``--storage``) are :mod:`.trials`'s table."""

from __future__ import annotations

import csv
import difflib
import io
import json
import math
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Optional, TypeVar, get_args

from pydantic import BaseModel, ValidationError

from ..accounting import params
from ..accounting.steps import train_flops_through
from ..config.schema import Config, load_config
from ..errors import MinigptError
from ..fileio import STATE_BOUNDS, atomic_write_set, field_path, read_bytes, read_json
from ..run import folder as runs
from ..run.metrics import METRICS, read_events
from .noise import verdicts

if TYPE_CHECKING:  # matplotlib is imported where it is used
    from matplotlib.figure import Figure

#: The files a summary writes; summary.json is also what proves an earlier summary minigpt's.
SUMMARY_FILES = ("summary.md", "summary.csv", "summary.json", "summary.png")

#: Config keys that never make two runs different variants; with the seed and the corpus, different
#: runs.
_SAME_RUN = {"name", "train.out_dir", "tokenizer.path"}
_IGNORED = _SAME_RUN | {"seed", "data.fingerprint"}
#: The share of each curve's first evals the plot's y-range leaves out (step 0's loss would set it
#: otherwise).
EARLY = 0.2
#: The terminal table's width in columns, and its widest cell (longer text ends in "…"; summary.md
#: has it whole).
WIDTH, CELL = 100, 24
#: The terminal table's columns (:func:`_spec`'s first CSV key) besides the keys that differ, which
#: go after the first.
_BRIEF = ("variant", "seeds", "final_val", "bits_per_byte", "time_to_target_s")


Model = TypeVar("Model", bound=BaseModel)


def _why(exc: OSError | ValidationError, schema: Optional[type[BaseModel]] = None) -> str:
    """What is wrong with a file: the OS's reason, or the first key its schema refuses, in words (an
    unknown top-level key with the close spelling of one of ``schema``'s, as a config's gets)."""
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    err = exc.errors()[0]
    loc, msg = field_path(err["loc"]), err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        *section, name = loc.split(".")
        for part in section:  # down to the model that holds the key, through Optional[...]
            field = schema.model_fields.get(part) if schema else None
            schema = (
                next(
                    (
                        t
                        for t in (field.annotation, *get_args(field.annotation))
                        if isinstance(t, type) and issubclass(t, BaseModel)
                    ),
                    None,
                )
                if field
                else None
            )
        close = difflib.get_close_matches(name, list(schema.model_fields) if schema else [], n=1)
        msg = (
            f"unknown key; did you mean {'.'.join([*section, close[0]])}?"
            if close
            else "unknown key; remove it"
        )
    msg = (
        "the top level must be a mapping"
        if err["type"] == "model_type" and not loc
        else msg[0].lower() + msg[1:]
    )
    return f"{loc}: {msg}" if loc else msg


def read_model(schema: type[Model], source: Path | Any, what: str, **fields: Any) -> Model:
    """``source`` (a JSON file minigpt wrote, or parsed data) read through ``schema``; a
    :class:`MinigptError` from ``what`` when it is not what the schema says,
    :func:`~minigpt_cli.fileio.read_problem`'s when the file cannot be read (unreadable, missing,
    past :data:`~minigpt_cli.fileio.STATE_BOUNDS`)."""
    data = read_bytes(source, source.name, STATE_BOUNDS) if isinstance(source, Path) else None
    try:
        return (
            schema.model_validate_json(data)
            if isinstance(source, Path)
            else schema.model_validate(source)
        )
    except ValidationError as exc:  # not what the schema says
        raise MinigptError(what.format(why=_why(exc, schema), **fields)) from None


@dataclass
class RunRecord:
    """One run folder's config and curves."""

    path: Path
    cfg: Config
    evals: list[dict]  # metrics.jsonl eval events: step, elapsed_s, val_loss
    rates: list[float]  # tokens/s of its train events
    # The run's config.yaml differs from its checkpoint's (which is read).
    note: Optional[str] = None

    @property
    def final(self) -> float:
        return self.evals[-1]["val_loss"]


def read_run(path: Path) -> RunRecord:
    """A run folder as a :class:`RunRecord`; a :class:`MinigptError` when it has no eval yet."""
    events = read_events(path / METRICS)  # none when the file is absent
    evals = [e for e in events if e["event"] == "eval"]
    if not evals:
        raise MinigptError(
            f"{path} has no eval in metrics.jsonl yet", "train it until its first eval"
        )
    rates = [e["tokens_per_sec"] for e in events if e.get("tokens_per_sec")]
    cfg = load_config(path / runs.CONFIG)
    if not runs.has_checkpoint(path):
        return RunRecord(path, cfg, evals, rates)
    from ..run.checkpoint import saved_config  # torch: only for a run with weights

    which = runs.LAST if runs.has_weights(runs.checkpoint_dir(path, runs.LAST)) else runs.BEST
    # Verified: the record of what the weights are.
    saved = saved_config(runs.checkpoint_dir(path, which))
    differs = saved.to_dict() != cfg.to_dict()
    note = (
        f"note: {path / runs.CONFIG} differs from its checkpoint's config.yaml; compared as the "
        "checkpoint records it (the config the weights were trained with)"
        if differs
        else None
    )
    return RunRecord(path, saved, evals, rates, note)


def _sweep_order(folder: Path) -> dict[str, int]:
    """A sweep folder's runs done, by name, in the order of the sweep's file (its ``sweep.json``'s
    ``done``); empty for another folder, or a state file that does not read as one (``sweep`` names
    that)."""
    try:
        done = read_json(folder / runs.SWEEP, runs.SWEEP, STATE_BOUNDS).get("done")
    except (MinigptError, AttributeError):
        return {}
    return {name: i for i, name in enumerate(done)} if isinstance(done, list) else {}


def expand(paths: list[Path]) -> list[Path]:
    """Run folders: each path itself when it is one, else those inside it (a sweep's in its file's
    order, others by name); a :class:`MinigptError` if neither, or no path is given."""
    if not paths:
        raise MinigptError(
            "give run folders (or a sweep's folder) to compare, or --storage URL for a study's "
            "trials"
        )
    out = []
    for p in paths:
        if (p / runs.CONFIG).is_file():
            out.append(p)
            continue
        inside = sorted(q for q in p.iterdir() if (q / runs.CONFIG).is_file()) if p.is_dir() else []
        order = _sweep_order(p) if inside else {}
        # Stable: the runs the sweep has not done stay by name.
        inside.sort(key=lambda q: order.get(q.name, len(order)))
        if not inside:
            raise MinigptError(
                f"{str(p)!r} is neither a run folder (config.yaml and metrics.jsonl) nor a folder "
                "of runs"
            )
        out += inside
    return out


def _key(r: RunRecord, ignored: set[str] = _IGNORED) -> str:
    """The run's config as text, less the ``ignored`` keys: equal for the runs of one variant (or
    one run)."""
    return json.dumps({k: v for k, v in r.cfg.flat().items() if k not in ignored}, sort_keys=True)


def _distinct(records: list[RunRecord], notes: list[str]) -> list[RunRecord]:
    """``records`` less repeats (one config, corpus and seed), keeping the one that trained most
    steps (the first given of those); a note per repeated seed names them all and the one kept."""
    same: dict[str, list[RunRecord]] = {}
    for r in records:
        same.setdefault(_key(r, _SAME_RUN), []).append(r)
    kept = {id(max(group, key=lambda r: r.evals[-1]["step"])) for group in same.values()}
    notes += [
        f"note: {', '.join(str(r.path) for r in group)} are one config at seed "
        f"{group[0].cfg.seed}: "
        f"repeats, not seeds; counted once, as {next(r.path for r in group if id(r) in kept)} "
        "(the most steps)"
        for group in same.values()
        if len(group) > 1
    ]
    return [r for r in records if id(r) in kept]


def _seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def _mean_sd(values: list[float]) -> tuple[float, Optional[float]]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def _bytes_per_token(cfg: Config, run_dir: Path, cache: dict, notes: list[str]) -> Optional[float]:
    """UTF-8 bytes per token of the run's val split; None, with a note saying why, when it cannot be
    read."""
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
        notes.append(f"note: no bits per byte for {run_dir}: {exc}")
        return None


@dataclass
class Variant:
    """Runs of one config at several seeds, and what the table says of them."""

    name: str
    runs: list[RunRecord] = field(default_factory=list)
    row: dict[str, Any] = field(default_factory=dict)


def _at_time(r: RunRecord, t: float) -> float:
    """The run's val loss at its last eval at or before ``t`` seconds (its first eval when none
    is)."""
    before = [e for e in r.evals if e["elapsed_s"] <= t + 1e-9]
    return (before or r.evals[:1])[-1]["val_loss"]


def _fmt(mean: Optional[float], sd: Optional[float], digits: int = 4) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


def summarize(
    run_dirs: list[Path],
    *,
    out: Optional[Path] = None,
    target: Optional[float] = None,
    variants: Optional[dict[str, str]] = None,
    metric: Optional[str] = None,
    stopped: Collection[Path] = (),
    notes: Collection[str] = (),
    echo: Callable[[str], None] = lambda m: None,
) -> dict:
    """Compare runs (the README's columns), writing the summary files into ``out`` when given;
    ``variants`` (folder name -> variant) defaults to the name less ``-s<seed>``; ``stopped``: runs
    cut short on purpose (a pruned trial's), whose final value never sets the default target;
    ``notes``: the caller's, said with the summary's own. Raises MinigptError: a run without an
    eval, a bad ``metric`` or ``target``, an ``out`` that holds a run or files of the user's."""
    read = [read_run(p) for p in dict.fromkeys(Path(d).resolve() for d in run_dirs)]  # each once
    run_notes = [*notes, *(r.note for r in read if r.note)]  # a repeat's edited config.yaml too
    orders = {folder: _sweep_order(folder) for folder in {r.path.parent for r in read}}
    run_notes += [
        f"note: {r.path} is not among the runs {r.path.parent / runs.SWEEP} lists as done: a copy, "
        "or a run its sweep has not finished; compared by its folder's name"
        for r in read
        if orders[r.path.parent] and r.path.name not in orders[r.path.parent]
    ]
    records = _distinct(read, run_notes)
    groups: dict[str, Variant] = {}
    for r in records:
        key = _key(r)
        name = (variants or {}).get(r.path.name) or re.sub(r"-s\d+$", "", r.path.name)
        if key not in groups and name in {
            v.name for v in groups.values()
        }:  # the same name, another config
            name = f"{r.path.parent.name}/{name}"
        groups.setdefault(key, Variant(name)).runs.append(r)
    flats = {k: v.runs[0].cfg.flat() for k, v in groups.items()}
    columns = sorted(
        k
        for k in set().union(*flats.values()) - _IGNORED
        if len({json.dumps(f.get(k)) for f in flats.values()}) > 1
    )
    same_corpus = len({r.cfg.data.fingerprint for r in records}) == 1
    if metric not in (None, "val_loss", "bits_per_byte"):
        raise MinigptError(f"--metric {metric!r}: use val_loss or bits_per_byte")
    if target is not None and not (math.isfinite(target) and target > 0):
        raise MinigptError(
            f"--target {target}: give a positive loss (or bits per byte), e.g. --target 1.9"
        )
    if metric == "val_loss" and not same_corpus:
        raise MinigptError(
            "--metric val_loss: the runs trained on different corpora, whose val losses do not "
            "compare",
            "use --metric bits_per_byte",
        )
    notes = (
        []
        if same_corpus
        else [
            "note: the runs trained on different corpora: val losses do not compare, so only bits "
            "per byte is shown"
        ]
    )
    if (
        len({(r.cfg.tokenizer.kind, r.cfg.tokenizer.vocab_size) for r in records}) > 1
        and same_corpus
    ):
        notes.append(
            "note: the variants use different tokenizers: val loss is per token of each, so "
            "compare bits per byte"
        )
    metric = metric or ("val_loss" if not notes else "bits_per_byte")
    notes += run_notes  # after the metric is chosen: these do not change it
    few = [r for r in records if len(r.evals) < 3]
    if few:
        notes.append(
            f"note: {len(few)} of the runs have fewer than 3 evals ({few[0].path.name}: "
            f"{len(few[0].evals)}): their curves, val @ equal time and time to target rest on too "
            "few points; evaluate more often (train.eval_interval)"
        )
    equal_time = min(r.evals[-1]["elapsed_s"] for r in records)
    cache: dict = {}
    bpt = {r.path: _bytes_per_token(r.cfg, r.path, cache, notes) for r in records}
    # The target is in the metric's unit: nats per token, or bits per byte (a loss / ln 2 / bytes
    # per token).
    scale = {
        r.path: 1.0
        if metric == "val_loss"
        else (1 / math.log(2) / bpt[r.path] if bpt[r.path] else math.inf)
        for r in records
    }
    # The worst final value of the runs that ran their course: each of those reaches it.
    if target is None:
        stop = {Path(p).resolve() for p in stopped}
        target = max(
            (
                r.final * scale[r.path]
                for r in records
                if scale[r.path] < math.inf and r.path not in stop
            ),
            default=math.inf,
        )
    for key, v in groups.items():
        cfg = v.runs[0].cfg
        pc = params.count(cfg.model)
        per_token = params.flops(cfg.model, cfg.model.block_size)["train_with_lm_head"]
        bpb = [r.final / math.log(2) / bpt[r.path] for r in v.runs if bpt[r.path]]
        reached = [
            next((e["elapsed_s"] for e in r.evals if e["val_loss"] * scale[r.path] <= target), None)
            for r in v.runs
        ]
        v.row = {
            "variant": v.name,
            **{c: flats[key].get(c) for c in columns},
            "seeds": len(v.runs),
            "params": pc.total,
            "params_non_embedding": pc.non_embedding,
            "flops_per_token": per_token,
            "tokens_per_sec": statistics.fmean(
                statistics.median(r.rates) for r in v.runs if r.rates
            )
            if any(r.rates for r in v.runs)
            else None,
            "steps": statistics.fmean(r.evals[-1]["step"] for r in v.runs),
        }
        stats = {
            "final_val": [r.final for r in v.runs],
            "best_val": [min(e["val_loss"] for e in r.evals) for r in v.runs],
            "val_at_equal_time": [_at_time(r, equal_time) for r in v.runs],
            "bits_per_byte": bpb,
        }
        for name, values in stats.items():
            if name != "bits_per_byte" and not same_corpus:
                continue
            mean, sd = _mean_sd(values) if values else (None, None)
            v.row[name], v.row[f"{name}_sd"], v.row[f"{name}_all"] = mean, sd, values
        ends = sorted({r.evals[-1]["step"] for r in v.runs})
        if len(ends) > 1:
            notes.append(
                f"note: {v.name}'s seeds ended at different steps ({', '.join(map(str, ends))}): a "
                "run is unfinished or stopped early, and its mean mixes them"
            )
        done = [t for t in reached if t is not None]
        v.row["time_to_target_s"] = statistics.fmean(done) if len(done) == len(reached) else None
        v.row["seeds_reached_target"] = len(done)  # of "seeds"; the table writes "1/3"
    ordered = list(groups.values())
    sentences, pairs = verdicts(
        [v.row for v in ordered], "final_val" if metric == "val_loss" else "bits_per_byte"
    )
    result = {
        "columns": columns,
        "rows": [v.row for v in ordered],
        "notes": notes,
        "target": target,
        "equal_time_s": equal_time,
        "metric": metric,
        "sentences": sentences,
        "pairs": pairs,
    }
    if out is not None:
        _write(result, Path(out), lambda: _plot(ordered, metric, scale))
    return result


def _spec(result: dict) -> list[tuple[str, list[str], Callable[[dict], str]]]:
    """The summary's columns: the table's header, the CSV keys behind it, and its cell as text."""
    spec = [
        ("variant", ["variant"], lambda r: r["variant"]),
        *((c, [c], lambda r, c=c: short_text(r[c])) for c in result["columns"]),
        ("seeds", ["seeds"], lambda r: str(r["seeds"])),
        ("params", ["params"], lambda r: f"{r['params']:,}"),
        ("non-emb", ["params_non_embedding"], lambda r: f"{r['params_non_embedding']:,}"),
        ("FLOPs/token", ["flops_per_token"], lambda r: f"{r['flops_per_token']:,}"),
        (
            "tokens/s",
            ["tokens_per_sec"],
            lambda r: f"{r['tokens_per_sec']:,.0f}" if r["tokens_per_sec"] else "n/a",
        ),
        ("steps", ["steps"], lambda r: f"{r['steps']:.0f}"),
    ]
    stats = [("val bits/byte", "bits_per_byte")]
    if "final_val" in (result["rows"][0] if result["rows"] else {}):
        stats[:0] = [
            ("final val", "final_val"),
            ("best val", "best_val"),
            (f"val @ {_seconds(result['equal_time_s'])}s", "val_at_equal_time"),
        ]
    spec += [(head, [k, f"{k}_sd"], lambda r, k=k: _fmt(r[k], r[f"{k}_sd"])) for head, k in stats]
    unit = "nats" if result["metric"] == "val_loss" else "bits/byte"
    target = result["target"]
    spec.append(
        (
            f"s to {target:.3f} {unit}" if math.isfinite(target) else "s to target",
            ["time_to_target_s", "seeds_reached_target"],
            lambda r: (
                f"{r['time_to_target_s']:.1f}"
                if r["time_to_target_s"] is not None
                else f"not reached ({r['seeds_reached_target']}/{r['seeds']})"
            ),
        )
    )
    return spec


def _csv_rows(result: dict) -> list[list[Any]]:
    """summary.csv's rows: the JSON rows' names and plain values, standard deviations in columns of
    their own."""
    keys = [k for _, ks, _ in _spec(result) for k in ks]
    return [keys, *([csv_cell(r.get(k)) for k in keys] for r in result["rows"])]


def csv_cell(value: Any) -> Any:
    """A CSV cell: a number or text as it is, nothing as an empty cell, anything else as JSON
    (``true``)."""
    if value is None:
        return ""
    return (
        value
        if isinstance(value, (int, float, str)) and not isinstance(value, bool)
        else json.dumps(value)
    )


def _seconds(t: float) -> str:
    """Seconds for a column header: whole from 10 s, else two significant digits (0.27, not 0)."""
    return f"{t:.0f}" if t >= 10 else f"{t:.2g}"


def value_text(value: Any) -> str:
    """A config value as text: text as it is, anything else as JSON, which ``--set`` reads back."""
    return value if isinstance(value, str) else json.dumps(value)


def short_text(value: Any) -> str:
    """A config value for a table's cell: a float to 4 significant digits (a searched learning
    rate's 18 digits stay in summary.csv and .json), anything else as :func:`value_text` writes it.
    """
    return f"{value:.4g}" if isinstance(value, float) else value_text(value)


#: How a table cell writes what would break a Markdown row: a ``|`` ends the cell, a line break the
#: row.
_CELL_ESCAPES = {"\\": "\\\\", "|": "\\|", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell: :data:`_CELL_ESCAPES`, other unprintables as Python
    writes them."""
    return "".join(_CELL_ESCAPES.get(c) or (c if c.isprintable() else repr(c)[1:-1]) for c in text)


def table_lines(spec: list, rows: list[dict]) -> list[str]:
    """The Markdown table of ``spec``'s columns, every cell escaped by :func:`_cell`."""
    cells = [[h for h, _, _ in spec], *([f(r) for *_, f in spec] for r in rows)]
    lines = ["| " + " | ".join(map(_cell, row)) + " |" for row in cells]
    lines.insert(1, "|" + "---|" * len(spec))
    return lines


def _clip(text: str) -> str:
    return text if len(text) <= CELL else text[: CELL - 1] + "…"


def _narrow(result: dict, width: int) -> tuple[list, list[str]]:
    """The terminal's columns: :data:`_BRIEF`, and after the variant as many keys that differ as fit
    in ``width`` (headed by their last part where that is unambiguous), cells clipped to
    :data:`CELL`; and the keys left out."""
    spec = [(_clip(h), ks, lambda r, f=f: _clip(f(r))) for h, ks, f in _spec(result)]
    brief = [c for c in spec if c[1][0] in _BRIEF]
    ends = [c.rpartition(".")[2] for c in result["columns"]]
    keys = [
        (end if ends.count(end) == 1 else h, ks, f)
        for end, (h, ks, f) in zip(ends, (c for c in spec if c[1][0] in result["columns"]))
    ]
    shown: list = []
    for key in keys:
        if max(map(len, table_lines([brief[0], *shown, key, *brief[1:]], result["rows"]))) <= width:
            shown.append(key)
    return [brief[0], *shown, *brief[1:]], [
        c for c, k in zip(result["columns"], keys) if k not in shown
    ]


def format_summary(result: dict, width: Optional[int] = WIDTH) -> str:
    """The table (Markdown), then the notes and the pairwise sentences. ``width`` (a terminal's
    columns): the variant, the keys that differ that fit and the results (:func:`_narrow`); None:
    every column (summary.md)."""
    spec, hidden = _narrow(result, width) if width else (_spec(result), [])
    notes = result["notes"] + (
        [
            f"note: {len(hidden)} more {'key differs' if len(hidden) == 1 else 'keys differ'} "
            f"({', '.join(hidden[:3]) + (', ...' if len(hidden) > 3 else '')}); summary.md has "
            "every column"
        ]
        if hidden
        else []
    )
    lines = (
        table_lines(spec, result["rows"]) + [""] + notes + [f"- {s}" for s in result["sentences"]]
    )
    return "\n".join(lines).rstrip() + "\n"


def _write(result: dict, out: Path, png: Callable[[], bytes]) -> None:
    """summary.md, .csv, .json and .png (drawn by ``png``), renamed into place as a set: an
    interrupt leaves the previous set or none."""
    check_output(out)
    out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    csv.writer(buf).writerows(_csv_rows(result))
    texts = {
        "summary.md": format_summary(result, width=None),
        "summary.csv": buf.getvalue(),
        "summary.json": json.dumps(result, indent=1) + "\n",
    }
    files = {out / name: text.encode("utf-8") for name, text in texts.items()}
    files[out / "summary.png"] = png()
    atomic_write_set(files)


class _Summary(BaseModel):
    """What proves a summary.json minigpt's: the keys :func:`summarize` writes."""

    columns: list
    rows: list
    metric: str


def check_output(out: Path) -> None:
    """Refuse a run folder as ``out``, and summary files in ``out`` that are not an earlier
    summary."""
    if (out / runs.CONFIG).is_file() or runs.made_here(out):
        raise MinigptError(
            f"--output {out} is a run folder, which holds that run's record",
            "pass another --output",
        )
    if any(os.path.lexists(out / name) for name in SUMMARY_FILES):
        summary = out / "summary.json"
        users = (
            "{path} is not a summary minigpt wrote (its summary.json is not one: {why}); pass "
            "another --output"
        )
        if not os.path.lexists(summary):  # the other files, without the one that proves them ours
            raise MinigptError(users.format(path=out, why="there is none"))
        read_model(_Summary, summary, users, path=out)


def figure(variants: list[Variant], metric: str, scale: dict[Path, float]) -> "Figure":
    """The table's ``metric`` (val loss in nats per token, or bits per byte: a run's loss times
    ``scale``) against steps, wall time and training FLOPs: each variant's mean over seeds, its
    seeds' range shaded and edged. The y-range spans the curves past each one's first :data:`EARLY`
    of evals, where the variants differ."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.13, top=0.9, wspace=0.2)
    axes = fig.subplots(1, 3, sharey=True)
    later: list[float] = []  # the values that set the y-range
    for i, v in enumerate(variants):
        # Bits per byte needs the run's bytes per token.
        seeds = [r for r in v.runs if scale[r.path] < math.inf]
        if not seeds:
            continue
        cfg, color = seeds[0].cfg, f"C{i % 10}"
        steps = sorted(set.intersection(*({e["step"] for e in r.evals} for r in seeds)))
        at = [{e["step"]: e for e in r.evals} for r in seeds]
        ys = [[a[s]["val_loss"] * scale[r.path] for a, r in zip(at, seeds)] for s in steps]
        low, high = [min(y) for y in ys], [max(y) for y in ys]
        # Fewer than 3 evals: every one sets the range (without step 0's, a 2-eval curve is a point
        # off the plot).
        skip = min(math.ceil(EARLY * len(steps)), len(steps) - 1) if len(steps) >= 3 else 0
        later += low[skip:] + high[skip:]
        xs = {
            "optimizer step": steps,
            "wall time (s, evals included)": [
                statistics.fmean(a[s]["elapsed_s"] for a in at) for s in steps
            ],
            # exact under a batch-size ramp or sequence-length warmup (their steps are smaller)
            "training FLOPs": [train_flops_through(s, cfg) for s in steps],
        }
        for ax, (label, x) in zip(axes, xs.items()):
            ax.plot(
                x,
                [statistics.fmean(y) for y in ys],
                "o-",
                markersize=2,
                color=color,
                label=f"{v.name} ({_seeds(len(seeds))})",
            )
            if len(seeds) > 1:
                ax.fill_between(x, low, high, alpha=0.25, color=color, linewidth=0)
                for edge in (low, high):
                    ax.plot(x, edge, color=color, linewidth=0.7, alpha=0.8)
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
    if later:
        lo, hi = min(later), max(later)
        pad = 0.05 * (hi - lo) or 0.01 * abs(hi) or 0.01
        axes[0].set_ylim(lo - pad, hi + pad)  # shared by all three
    what = "val loss (nats/token)" if metric == "val_loss" else "val bits per byte"
    axes[0].set_ylabel(what)
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"{what}: mean over seeds, shaded from the lowest to the highest seed; the y-range leaves "
        f"out each curve's first {EARLY:.0%} of evals"
    )
    return fig


def _plot(variants: list[Variant], metric: str, scale: dict[Path, float]) -> bytes:
    """:func:`figure` as PNG bytes."""
    png = io.BytesIO()
    figure(variants, metric, scale).savefig(png, format="png")
    return png.getvalue()
