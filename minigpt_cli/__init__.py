"""minigpt: train, sample and measure small GPT models from the command line, or from Python.

The Python API takes the same typed configs as the CLI::

    from minigpt_cli import count_params, generate, load_config, load_run, train

    cfg = load_config("tiny", ["train.max_iters=50"])  # a shipped config or YAML file, and --set's
    result = train(cfg)                                # a TrainResult: run_dir, step, losses
    texts = generate(result.run_dir, {"prompt": "ROMEO:", "max_new_tokens": 40})
    run = load_run(result.run_dir)                     # .model (eval mode), .tokenizer, .config
    print(run.tokenizer.encode("ROMEO:"), count_params(cfg)["total"])

Nothing heavy is imported until one of them is used (``minigpt --help`` answers without importing
torch).
"""

__version__ = "0.1.0"

__all__ = [
    "Config",
    "TrainResult",
    "count_params",
    "evaluate",
    "export_run",
    "generate",
    "load_config",
    "load_run",
    "train",
]

#: Each name's module, imported on first use (PEP 562).
_API = {
    "Config": "config.schema",
    "load_config": "config.schema",
    "train": "trainer.loop",
    "TrainResult": "trainer.loop",
    "generate": "sample.generate",
    "load_run": "sample.load",
    "count_params": "accounting.count",
    "evaluate": "eval.evaluate",
    "export_run": "hf.export",
}


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_API[name]}", __name__), name)
