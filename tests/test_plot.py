"""``minigpt plot`` and loss.png: the training loss at every log step, smoothed, the evals over it,
and any runs overlaid by step, time or FLOPs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_user_error, records, tiny

from minigpt_cli.accounting import params
from minigpt_cli.run.metrics import ema
from minigpt_cli.trainer import train


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, data_dir) -> list[Path]:
    """Two tiny runs that differ in width (so in FLOPs per step), a train event every step."""
    out = tmp_path_factory.mktemp("plot")
    return [
        train(
            tiny(
                data_dir,
                "train.max_iters=12",
                "train.eval_interval=4",
                "train.eval_iters=1",
                f"model.n_embd={width}",
                f"train.out_dir={out}",
            ),
            name,
            echo=lambda m: None,
            progress=False,
        ).run_dir
        for name, width in (("narrow", 16), ("wide", 32))
    ]


def test_ema_is_the_debiased_weighted_average():
    """The smoothed curve: y_t = sum_i w^i x_(t-i) / sum_i w^i (pandas' ewm(adjust=True)), w = 1 -
    2/(span+1) with span a tenth of the points; its first value is the first point, not pulled
    toward 0."""
    xs = list(np.random.default_rng(0).normal(3.0, 0.3, 50))
    w = 1 - 2 / (5 + 1)  # 50 points: span 5
    want = [
        sum(w**i * xs[t - i] for i in range(t + 1)) / sum(w**i for i in range(t + 1))
        for t in range(len(xs))
    ]
    assert ema(xs) == pytest.approx(want, rel=1e-12)
    assert ema(xs)[0] == xs[0] and ema([2.0] * 7) == pytest.approx([2.0] * 7)


@pytest.mark.real_plot
def test_loss_png_draws_every_log_step_smoothed_and_the_evals_over_it(data_dir, tmp_path):
    from matplotlib.figure import Figure

    from minigpt_cli.run.metrics import draw_losses

    run = train(
        tiny(data_dir, "train.max_iters=20", "train.eval_iters=1", f"train.out_dir={tmp_path}"),
        "q",
        echo=lambda m: None,
        progress=False,
    ).run_dir
    png = (run / "loss.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 10_000  # matplotlib's, not the suite's stand-in
    events = records(run)
    train_pts = [(e["step"], e["loss"]) for e in events if e["event"] == "train"]
    evals = [(e["step"], e["train_loss"], e["val_loss"]) for e in events if e["event"] == "eval"]
    assert len(train_pts) == 20 and len(evals) == 2  # a point per log step, not per eval
    ax = Figure().add_subplot()
    draw_losses(ax, train_pts, evals)
    raw, smooth, train_eval, val = ax.get_lines()
    assert list(raw.get_ydata()) == [loss for _, loss in train_pts] and raw.get_alpha() < 0.5
    assert list(smooth.get_ydata()) == pytest.approx(ema([loss for _, loss in train_pts]))
    assert list(val.get_xdata()) == [0, 20] and list(val.get_ydata()) == [v for *_, v in evals]
    assert [line.get_label() for line in (smooth, train_eval, val)] == [
        "train (smoothed)",
        "train (eval)",
        "val (eval)",
    ]


def test_plot_overlays_runs_by_step_time_and_flops(cli, two_runs, tmp_path, monkeypatch):
    from matplotlib.image import imread

    from minigpt_cli.config.schema import load_config
    from minigpt_cli.experiments.plot import read_curves

    for x in ("step", "time", "flops"):
        out = tmp_path / f"{x}.png"
        res = cli("plot", *two_runs, "--x", x, "--output", out)
        assert res.exit_code == 0, res
        assert f"wrote {out}: 2 runs by {x}" in res.stderr
        assert imread(out).shape[:2] == (550, 900)
    for run in two_runs:
        events = records(run)
        cfg = load_config(run / "config.yaml")
        per_token = params.flops(cfg.model, cfg.model.block_size)["train_with_lm_head"]
        per_step = cfg.train.batch_size * cfg.model.block_size * per_token
        by = {x: read_curves(run, x) for x in ("step", "time", "flops")}
        assert [x for x, _ in by["step"].train] == [
            e["step"] for e in events if e["event"] == "train"
        ]
        assert [x for x, *_ in by["time"].evals] == [
            e["elapsed_s"] for e in events if e["event"] == "eval"
        ]
        assert [x for x, *_ in by["flops"].evals] == [0, 4 * per_step, 8 * per_step, 12 * per_step]
    # the wider model does more work per step: at equal steps, more FLOPs
    narrow, wide = (read_curves(r, "flops").evals[-1][0] for r in two_runs)
    assert wide > narrow > 0
    # a sweep's folder (a folder of runs) plots each of its runs; the default name is curves.png
    monkeypatch.chdir(tmp_path)
    res = cli("plot", two_runs[0].parent)
    assert res.exit_code == 0 and "wrote curves.png: 2 runs by step" in res.stderr, res
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_refuses_what_is_not_a_run_in_one_line(cli, two_runs, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("hello")
    assert_user_error(
        cli("plot", empty, "-o", tmp_path / "x.png"),
        f"'{empty}' is not a run folder (no metrics.jsonl nor config.yaml), nor a folder of runs",
    )
    assert_user_error(cli("plot", tmp_path / "nope"), f"'{tmp_path / 'nope'}': no such run folder")
    assert_user_error(cli("plot", two_runs[0], "--x", "epochs"), "--x 'epochs': use one of step")
    assert_user_error(cli("plot"), "give at least one run folder to plot")
    mine = tmp_path / "mine.png"
    mine.write_text("not a picture")
    assert_user_error(cli("plot", two_runs[0], "-o", mine), "exists and is not a PNG")
    assert mine.read_text() == "not a picture" and not (tmp_path / "x.png").exists()
    assert_user_error(cli("plot", two_runs[0], "-o", tmp_path), "is a folder")


def test_plot_is_listed_and_its_help_imports_no_torch():
    code = (
        "import sys; from minigpt_cli.cli import app; from typer.testing import CliRunner;"
        "r = CliRunner().invoke(app, ['--help']); assert 'plot ' in r.output, r.output;"
        "r = CliRunner().invoke(app, ['plot', '--help']); assert '--x step|time|flops' in r.output;"
        "import minigpt_cli.experiments.plot;"
        "print(json.dumps('torch' in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json;" + code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) is False
