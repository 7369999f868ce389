"""train.trackers: W&B (offline) and MLflow (a SQLite store) receive what metrics.jsonl receives,
read back through each tracker's own records; a resume continues the same tracker run; a tracker
that cannot start is one line, exit 2, before any step. Marked ``trackers``; the tests that run a
tracker's library are marked ``client`` too (left out of the suite, run by .ci/run with -m client)
and skipped where its package is not installed."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY, CliResult, assert_user_error, cli_process, records, tiny, working_dir

pytestmark = pytest.mark.trackers

needs_wandb = pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None,
    reason="wandb is not installed (pip install 'minigpt-cli[wandb]')",
)
needs_mlflow = pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None,
    reason="mlflow is not installed (pip install 'minigpt-cli[mlflow]')",
)


def _train(tmp_path: Path, data_dir: Path, *args: str, env: dict | None = None):
    """``minigpt train`` on tiny.yaml in a process of its own, in ``tmp_path``: a train record
    every step, an eval every 10, no samples; W&B offline, with no login (HOME is ``tmp_path``)."""
    base = {"WANDB_MODE": "offline", "HOME": str(tmp_path), "WANDB_API_KEY": ""}
    words = [
        "train",
        TINY,
        "--no-progress",
        *("--set", f"data.data_dir={data_dir}"),
        *("--set", "train.log_interval=1", "--set", "train.eval_interval=10"),
        *("--set", "train.sample_tokens=0"),
        *args,
    ]
    return cli_process(words, env_extra={**base, **(env or {})}, cwd=tmp_path)


def _expected(run_dir: Path) -> dict[tuple[str, int], float]:
    """metrics.jsonl as (``<event>/<field>``, step) -> value: what each tracker must hold."""
    return {
        (f"{r['event']}/{k}", r["step"]): v
        for r in records(run_dir)
        for k, v in r.items()
        if k not in ("event", "step")
    }


# ----------------------------------------------------------------------------- W&B's own records

#: The .wandb file: LevelDB's log format (32 KiB blocks of chunks: CRC-32, length, type) after a
#: 7-byte header (":W&B", magic, version); each whole chunk chain is one protobuf ``Record``.
BLOCK, CHUNK_HEADER = 32768, 7
FULL, LAST = 1, 4


def wandb_records(path: Path) -> list:
    """The protobuf ``Record`` objects of an offline run's .wandb file, as wandb wrote them."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, parts, out = CHUNK_HEADER, b"", []
    while pos + CHUNK_HEADER <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER:  # a block's tail too short for a chunk: padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        parts += data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            out.append(record)
            parts = b""
    return out


def wandb_run(offline_dir: Path) -> tuple[dict, dict[tuple[str, int], float]]:
    """An offline run's facts (id, name, group, config) and its history as (name, step) -> value."""
    (path,) = offline_dir.glob("run-*.wandb")
    facts: dict = {}
    history = {}
    for r in wandb_records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            facts.update(id=r.run.run_id, name=r.run.display_name, group=r.run.run_group)
            facts["config"] = {i.key: json.loads(i.value_json) for i in r.run.config.update}
        elif kind == "history":
            items = {
                "/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item
            }
            step = items.pop("_step")
            history.update(((k, step), v) for k, v in items.items() if not k.startswith("_"))
    return facts, history


# ----------------------------------------------------------------------------- MLflow's own records


def mlflow_runs(db: Path) -> tuple[list, dict]:
    """Every run in the SQLite store ``db`` (search_runs over its experiments), and the first's
    metric history as (name, step) -> [values]."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    ids = [e.experiment_id for e in client.search_experiments()]
    found = client.search_runs(ids)
    history: dict = {}
    if found:
        for key in found[0].data.metrics:
            for m in client.get_metric_history(found[0].info.run_id, key):
                history.setdefault((key, m.step), []).append(m.value)
    return found, history


@pytest.mark.client
@needs_wandb
@needs_mlflow
def test_wandb_and_mlflow_hold_metrics_jsonl_and_a_resume_continues_their_runs(tmp_path, data_dir):
    res = _train(
        tmp_path,
        data_dir,
        *("--set", "train.max_iters=20", "--set", "train.trackers=[wandb, mlflow]"),
        *("--run-name", "r"),
    )
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "r"
    expected = _expected(run)
    assert {step for _, step in expected} == set(range(21))
    ids = json.loads((run / "trackers.json").read_text())
    # W&B: offline (no login), said in one line naming where it wrote.
    (offline,) = (run / "wandb").glob("offline-run-*")
    said = [line for line in (res.stdout + res.stderr).splitlines() if line.startswith("wandb:")]
    assert len(said) == 1 and "offline" in said[0] and str(offline.relative_to(tmp_path)) in said[0]
    facts, history = wandb_run(offline)
    assert history == expected
    assert facts["id"] == ids["wandb"] and facts["name"] == "r"
    assert facts["config"]["train.max_iters"] == 20 and facts["config"]["name"] == "tiny"
    # MLflow: the SQLite store beside runs/, one run, its params the resolved config.
    found, history = mlflow_runs(tmp_path / "mlflow.db")
    assert [r.info.run_id for r in found] == [ids["mlflow"]]
    assert found[0].info.run_name == "r" and found[0].info.status == "FINISHED"
    assert found[0].data.params["train.max_iters"] == "20"
    assert found[0].data.params["model.n_embd"] == "32"
    assert history == {key: [value] for key, value in expected.items()}

    res = _train(
        tmp_path,
        data_dir,
        *("--resume", "runs/r", "--set", "train.max_iters=30"),
        *("--set", "train.trackers=[wandb, mlflow]"),
    )
    assert res.returncode == 0, res.stderr
    expected = _expected(run)
    assert {step for _, step in expected} == set(range(31))
    assert json.loads((run / "trackers.json").read_text()) == ids
    # W&B: a second offline session of the same run id, holding the steps after 20.
    sessions = sorted((run / "wandb").glob("offline-run-*"))
    assert len(sessions) == 2
    facts, later = wandb_run(next(s for s in sessions if s != offline))
    assert facts["id"] == ids["wandb"]
    assert later == {(k, step): v for (k, step), v in expected.items() if step > 20}
    # MLflow: the same run, its history now the whole of metrics.jsonl.
    found, history = mlflow_runs(tmp_path / "mlflow.db")
    assert [r.info.run_id for r in found] == [ids["mlflow"]]
    assert found[0].info.status == "FINISHED"
    assert history == {key: [value] for key, value in expected.items()}


# ----------------------------------------------------------------------------- refusals


def _without(tmp_path: Path, *packages: str) -> dict:
    """An environment in which ``import package`` fails for each of ``packages`` (a
    sitecustomize that blocks them)."""
    shim = tmp_path / "shim"
    shim.mkdir(exist_ok=True)
    blocked = "".join(f"sys.modules[{p!r}] = None\n" for p in packages)
    (shim / "sitecustomize.py").write_text(f"import sys\n{blocked}")
    return {"PYTHONPATH": str(shim)}


@pytest.mark.parametrize("package", ["wandb", "mlflow"])
@pytest.mark.parametrize("dry", [False, True])
def test_a_missing_tracker_package_is_one_line_before_any_step(tmp_path, data_dir, package, dry):
    """Said before PyTorch loads (2.5 s): torch is blocked too, and never imported."""
    res = _train(
        tmp_path,
        data_dir,
        *("--set", f"train.trackers=[{package}]"),
        *(["--dry-run"] if dry else []),
        env=_without(tmp_path, package, "torch"),
    )
    result = CliResult(res.returncode, res.stdout, res.stderr)
    assert_user_error(
        result, f"train.trackers: {package} needs the {package} package", f"minigpt-cli[{package}]"
    )
    assert not (tmp_path / "runs").exists()
    assert "step" not in res.stdout


def test_an_unknown_tracker_is_refused_with_the_choices(tmp_path, data_dir):
    res = _train(tmp_path, data_dir, "--set", "train.trackers=[neptune]", "--dry-run")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "train.trackers" in res.stderr and "wandb" in res.stderr and "mlflow" in res.stderr


@pytest.mark.client
@needs_mlflow
def test_an_unreachable_mlflow_server_is_one_line_before_any_step(tmp_path, data_dir):
    env = {
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:9",  # the discard port: nothing listens
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    }
    res = _train(tmp_path, data_dir, "--set", "train.trackers=[mlflow]", env=env)
    result = CliResult(res.returncode, res.stdout, res.stderr)
    assert_user_error(result, "the mlflow tracker could not start", "train.trackers")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert "step 0" not in res.stdout


@pytest.mark.client
@needs_mlflow
def test_a_tracker_failing_mid_run_is_one_warning_and_the_run_goes_on(
    tmp_path, data_dir, monkeypatch
):
    """The MLflow run is deleted at the step-10 eval: its later records fail, one warning says so,
    and the run ends with every metrics.jsonl record."""
    from mlflow.tracking import MlflowClient

    from minigpt_cli.trainer import train

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    run = tmp_path / "runs" / "r"

    def delete_at_10(step: int, val_loss: float) -> bool:
        if step == 10:
            MlflowClient(uri).delete_run(json.loads((run / "trackers.json").read_text())["mlflow"])
        return False

    said: list[str] = []
    cfg = tiny(data_dir, "train.max_iters=20", "train.eval_interval=10", "train.trackers=[mlflow]")
    result = train(cfg, "r", echo=said.append, progress=False, on_eval=delete_at_10)
    assert result.step == 20
    warnings = [line for line in said if line.startswith("warning: the mlflow tracker failed")]
    assert len(warnings) == 1, said
    assert "the mlflow tracker failed" in (run / "train.log").read_text()
    assert {r["step"] for r in records(run)} == set(range(21))


@pytest.mark.client
@pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None,
    reason="tensorboard is not installed (pip install 'minigpt-cli[tensorboard]')",
)
def test_tensorboard_as_a_tracker_writes_its_tags_with_metrics_jsonl_values(
    tmp_path, data_dir, monkeypatch
):
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    from minigpt_cli.trainer import train

    monkeypatch.chdir(tmp_path)
    cfg = tiny(
        data_dir, "train.max_iters=10", "train.eval_interval=5", "train.trackers=[tensorboard]"
    )
    run = train(cfg, "r", echo=lambda line: None, progress=False).run_dir
    events = EventMultiplexer().AddRunsFromDirectory(str(run / "tensorboard"))
    events.Reload()
    scalars = {
        (folder, tag): {e.step: e.value for e in events.Scalars(folder, tag)}
        for folder, tags in events.Runs().items()
        for tag in tags["scalars"]
    }
    train_records = [r for r in records(run) if r["event"] == "train"]
    evals = [r for r in records(run) if r["event"] == "eval"]
    # TensorBoard stores float32: the values as metrics.jsonl's, to float32's precision.
    as_f32 = lambda rows, key: {r["step"]: float(np.float32(r[key])) for r in rows}  # noqa: E731
    assert scalars == {
        (".", "train/loss"): as_f32(train_records, "loss"),
        (".", "train/lr"): as_f32(train_records, "lr"),
        ("loss_train", "loss"): as_f32(evals, "train_loss"),
        ("loss_val", "loss"): as_f32(evals, "val_loss"),
    }


@pytest.mark.client
@needs_mlflow
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_sweeps_runs_carry_its_name_and_each_trials_settings(tmp_path, data_dir, jobs):
    """A grid of two variants: each run is one MLflow run in the sweep's experiment, in the store
    beside runs/, with the trial's name and settings (in process, and with --jobs: processes)."""
    from mlflow.tracking import MlflowClient

    from minigpt_cli.experiments.sweep import run_sweep

    spec = {
        "name": "s",
        "base": str(TINY),
        "set": [
            f"data.data_dir={data_dir}",
            "train.eval_interval=4",
            "train.eval_iters=2",
            "train.sample_tokens=0",
            "train.trackers=[mlflow]",
        ],
        "grid": {"model.ffn": ["relu", "gelu"]},
        "seeds": 1,
        "budget": {"iters": 4},
    }
    (tmp_path / "s.yaml").write_text(json.dumps(spec))
    with working_dir(tmp_path):
        run_sweep(tmp_path / "s.yaml", jobs=jobs)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("s")
    found = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(found) == ["ffn-gelu-s1337", "ffn-relu-s1337"]
    for name, r in found.items():
        ffn = name.split("-")[1]
        assert json.loads(r.data.tags["minigpt.trial"]) == f"ffn-{ffn}"
        assert json.loads(r.data.params["sweep.settings"]) == {"model.ffn": ffn}
        assert r.data.params["model.ffn"] == ffn and r.data.params["sweep.sweep"] == '"s"'
        history = client.get_metric_history(r.info.run_id, "eval/val_loss")
        expected = [e for e in records(tmp_path / "runs" / "s" / name) if e["event"] == "eval"]
        assert [(m.step, m.value) for m in history] == [
            (e["step"], e["val_loss"]) for e in expected
        ]
