"""minigpt: train, sample and measure small GPT models from the command line, or from Python.

The Python API takes the same typed configs as the CLI::

    from minigpt_cli import load_config, train, generate, count_params

    cfg = load_config("configs/tiny.yaml", ["train.max_iters=50"])
    result = train(cfg, "quick")                  # a TrainResult: run_dir, step, losses
    texts = generate(result.run_dir, prompt="ROMEO:", max_new_tokens=40)
    print(count_params(cfg.model)["total"])
    print(evaluate(result.run_dir, full=True)["bits_per_byte"])
    export_run(result.run_dir, "exported/")      # a transformers folder

Nothing heavy is imported until one of them is used (``minigpt --help``
answers without importing torch).
"""

__version__ = "0.1.0"

__all__ = ["Config", "TrainResult", "count_params", "evaluate", "export_run", "generate", "load_config", "train"]

_API = {
    "Config": ("config", "Config"),
    "load_config": ("config", "load_config"),
    "train": ("trainer", "train"),
    "TrainResult": ("trainer", "TrainResult"),
    "generate": ("generation", "generate"),
    "count_params": ("count", "count_params"),
    "evaluate": ("evaluation", "evaluate"),
    "export_run": ("hf_export", "export_run"),
}


def __getattr__(name: str):
    """The API's names, imported on first use (PEP 562)."""
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module, attr = _API[name]
    return getattr(importlib.import_module(f".{module}", __name__), attr)
