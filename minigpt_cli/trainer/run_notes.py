"""The notes ``train`` says about a config before a run (and ``--dry-run`` lists): the config's own
(:func:`~minigpt_cli.config.notes.notes`), a parallelism one process ignores, and Muon settings that
do nothing in the run."""

from __future__ import annotations

from typing import Optional

from ..config.notes import notes
from ..config.schema import Config
from ..data.download import url_corpus_on_disk
from ..runtime import distributed as parallel
from ..runtime.distributed import Dist

#: train.muon settings in a run that does not use Muon: a note, as a sweep over the optimizer shares
#: one config.
MUON_UNUSED = (
    "note: {keys} set Muon, which train.optimizer adamw does not use: no effect in this run"
)


def config_notes(
    cfg: Config, dist: Optional[Dist] = None, corpus_on_disk: Optional[bool] = None
) -> list[str]:
    """The notes on a config before a run, and on a parallelism one process ignores.
    ``corpus_on_disk``: whether the named corpus is there and genuine (for the ``data.url`` note);
    None: looked at here."""
    if corpus_on_disk is None:
        corpus_on_disk = url_corpus_on_disk(cfg.data.data_dir, cfg.data.dataset, cfg.data.url)
    single = parallel.single_process_note(cfg.train.parallelism, dist or Dist.from_env())
    shared = parallel.shared_store_note()
    return (
        notes(cfg, corpus_on_disk=corpus_on_disk)
        + [note for note in (single, shared) if note]
        + _muon_note(cfg)
    )


def _muon_note(cfg: Config) -> list[str]:
    """:data:`MUON_UNUSED` for the ``train.muon`` keys given a value of their own (set, and not the
    default: a saved config.yaml lists every key) in a run whose ``train.optimizer`` is adamw; in a
    Muon run, a note for a variant setting that does nothing (cautious weight decay without weight
    decay, NorMuon's beta2 without NorMuon), a note and not an error, as sweeps share configs."""
    mu = cfg.train.muon
    keys = [
        f"train.muon.{k}"
        for k, f in type(mu).model_fields.items()
        if cfg.train.optimizer == "adamw"
        and k in mu.model_fields_set
        and getattr(mu, k) != f.default
    ]
    if keys:
        return [MUON_UNUSED.format(keys=", ".join(keys))]
    out = []
    if cfg.train.optimizer == "muon" and mu.cautious_weight_decay and mu.weight_decay == 0:
        out.append(
            "note: train.muon.cautious_weight_decay chooses where Muon's weight decay acts, and "
            "train.muon.weight_decay is 0: no effect in this run; set train.muon.weight_decay too"
        )
    if cfg.train.optimizer == "muon" and not mu.normuon and "beta2" in mu.model_fields_set:
        if mu.beta2 != type(mu).model_fields["beta2"].default:
            out.append(
                "note: train.muon.beta2 is NorMuon's, and train.muon.normuon is false: no effect "
                "in this run; set train.muon.normuon=true to use it"
            )
    return out
