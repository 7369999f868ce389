"""Fine-tuning: a run that starts from a local Hugging Face GPT-2, Llama, GPT-NeoX or Qwen3 folder
(``model.init_from``).

nanoGPT's ``init_from='gpt2'`` (its ``finetune_shakespeare`` config), with the folder on disk
instead of a hub download: :func:`resolve_init_from` takes the folder's architecture and
``tokenizer.json`` (kind ``hf``), :func:`load_pretrained` its weights. A resumed run reads its own
checkpoint and ``tokenizer.json`` instead, so it does not depend on the folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from ..config.schema import Config
from ..errors import MinigptError
from ..run import folder as runs
from .load import read_hf_config, weight_files

#: Model keys a fine-tuning config may set to other values than the folder's.
FREE_KEYS = frozenset(
    {"init_from", "dropout", "block_size", "init_std", "scale_residual_init", "multiple_of"}
)


def resolve_init_from(
    cfg: Config, run: Optional[Path] = None, note: Callable[[str], None] = lambda m: None
) -> Config:
    """``cfg`` with the architecture and tokenizer of ``model.init_from`` (``cfg`` itself when it is
    unset); applying it twice gives the same config.

    The model is the folder's (:func:`~minigpt_cli.hf.load.read_hf_config`) with the config's values
    for :data:`FREE_KEYS`; the tokenizer is kind ``hf``, ``tokenizer.path`` or the folder's
    ``tokenizer.json``. ``run``: the run folder the config continues or is the config of; its
    ``tokenizer.json`` is the tokenizer, and once the folder is gone its last checkpoint's model
    stands for config.json. Architecture keys (and a ``tokenizer.kind``) of the config that differ
    from the folder's are replaced, and ``note`` hears which: an ordinary config fine-tunes with
    ``--init-from``; ``note`` also hears of a ``model.block_size`` shorter than the folder's context
    (a shorter-context model is trained).

    Raises:
        MinigptError: no tokenizer.json in the folder, a ``tokenizer.path`` not found, a damaged
        one.
    """
    mc = cfg.model
    if mc.init_from is None:
        return cfg
    folder = Path(
        mc.init_from
    ).absolute()  # the run records where it is, wherever it is later read from
    # model.vocab_size: null is "the tokenizer's size", which the folder's model has: not a value to
    # compare.
    given = mc.model_fields_set - ({"vocab_size"} if mc.vocab_size is None else set())
    changes, shorter = [], None
    if (
        run is not None and not folder.is_dir()
    ):  # moved away since the run started: the run's record of it
        from ..run.checkpoint import (
            saved_config,
        )  # torch: only for a run folder, not count-params' configs

        ran = saved_config(runs.checkpoint_dir(run, runs.LAST)).model
        model = ran.model_copy(update={key: getattr(mc, key) for key in given})
    else:
        _, theirs = read_hf_config(folder, mc.block_size if "block_size" in given else None)
        weight_files(folder)  # refused now, not after the data is prepared
        if "block_size" in given:
            shorter = _shorter_context(folder, theirs)
        changes = [
            f"model.{key} {getattr(mc, key)!r} (the folder's: {getattr(theirs, key)!r})"
            for key in sorted(given - FREE_KEYS)
            if getattr(mc, key) != getattr(theirs, key)
        ]
        model = theirs.model_copy(update={key: getattr(mc, key) for key in given & FREE_KEYS})
    tc = cfg.tokenizer
    if (
        "kind" in tc.model_fields_set and tc.kind != "hf"
    ):  # an ordinary config's tokenizer, and its file
        changes.append(f"tokenizer.kind {tc.kind!r} (the folder's: 'hf', its tokenizer.json)")
        tc = tc.model_copy(update={"path": None})
    if changes:
        note(
            f"note: model.init_from takes the architecture and tokenizer of {folder}, in place of the "
            f"config's {', '.join(changes)}"
        )
    path = (
        Path(run) / runs.TOKENIZER
        if run is not None
        else Path(tc.path or folder / "tokenizer.json")
    ).absolute()
    if run is None and not path.is_file() and tc.path is None:
        raise MinigptError(
            f"{folder} has no tokenizer.json; save the model's tokenizer beside it "
            "(AutoTokenizer.from_pretrained(...).save_pretrained(folder)) or set tokenizer.path"
        )
    if run is None and not path.is_file():
        raise MinigptError(
            f"tokenizer.path {path} not found; fix it, or drop it to use {folder}/tokenizer.json"
        )
    if run is not None:  # the tokenizer the run was trained with, wherever the folder's is now
        _check_run_tokenizer(run, tc.path)
    else:
        from ..tokenizer.kinds import load_tokenizer

        # The user's file, not minigpt's: a damaged one is replaced, never deleted to be trained
        # again.
        fix = (
            "replace it with the model's own (AutoTokenizer.from_pretrained(MODEL)"
            ".save_pretrained(folder), MODEL the model's name on the hub) or set tokenizer.path"
            if tc.path is None
            else f"fix tokenizer.path, or drop it to use {folder}/tokenizer.json"
        )
        load_tokenizer(path, "hf", own=False, fix=fix)
    if shorter is not None:  # said once nothing is refused
        note(shorter)
    tokenizer = tc.model_copy(update={"kind": "hf", "path": str(path), "vocab_size": None})
    model = model.model_copy(update={"init_from": str(folder)})
    return cfg.model_copy(update={"model": model, "tokenizer": tokenizer})


def _shorter_context(folder: Path, ours) -> Optional[str]:
    """The note for a config's ``model.block_size`` (in ``ours``) shorter than the folder's context:
    the fine-tuned model then takes no longer a context than that, and a learned position table
    loses its later rows (export says so again); None when it is not shorter."""
    full = read_hf_config(folder)[1].block_size
    if ours.block_size >= full:
        return None
    table = (
        f"its position table cut from {full:,} rows to {ours.block_size:,}"
        if ours.pos_encoding == "learned"
        else f"the folder's context is {full:,}"
    )
    return (
        f"note: model.block_size {ours.block_size:,} is shorter than {folder}'s context of "
        f"{full:,} tokens: fine-tuning trains a {ours.block_size:,}-token model ({table}); set "
        f"model.block_size: {full} (or drop it) to keep the whole context"
    )


def _check_run_tokenizer(run: Path, named: Optional[str]) -> None:
    """Refuse run ``run``'s missing or damaged ``tokenizer.json``, and a ``tokenizer.path``
    (``named``) of another tokenizer than the run's, unless it is the file the checkpoint records
    (the run keeps a copy)."""
    from ..run.checkpoint import (
        saved_config,
    )  # torch: only for a run folder, not count-params' configs
    from ..tokenizer.kinds import check_run_tokenizer, load_run_tokenizer, load_tokenizer

    saved = saved_config(runs.checkpoint_dir(run, runs.LAST))
    saved = saved.model_copy(
        update={"tokenizer": saved.tokenizer.model_copy(update={"kind": "hf"})}
    )
    load_run_tokenizer(run, saved)
    recorded = saved.tokenizer.path and Path(saved.tokenizer.path).absolute()
    if named is not None and Path(named).is_file() and Path(named).absolute() != recorded:
        check_run_tokenizer(run, saved, load_tokenizer(named, "hf", own=False))


def load_pretrained(model, cfg: Config) -> None:
    """Copy ``model.init_from``'s weights into ``model`` (built from :func:`resolve_init_from`'s
    config); refused as :func:`~.load.load_hf_folder` refuses them."""
    from .load import load_hf_folder

    pretrained = load_hf_folder(cfg.model.init_from, block_size=cfg.model.block_size)
    model.load_state_dict(pretrained.state_dict())
