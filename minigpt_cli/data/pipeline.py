"""The config's corpus, tokenizer and token files made ready (:func:`prepare_data`), and the batches
drawn."""

from __future__ import annotations

import math
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence

import numpy as np

from ..config.schema import Config
from ..config.special_tokens import END_OF_TEXT
from ..errors import MinigptError
from ..fileio import NotRegularFile, check_regular, check_writable, errors_as, read_problem
from ..paths import corpus_path, dataset_dir, default_tokenizer_path
from ..run import env as run_env
from ..run import folder as runs
from ..tokenizer.kinds import Tokenizer, load_tokenizer
from ..tokenizer.training import check_vocab_size, train_tokenizer
from .corpus import Corpus, changed_file, corpus_text, cut_pieces, documents, matching, open_corpus
from .preparation import PreparedData, prepare

if (
    TYPE_CHECKING
):  # torch is imported where batches are drawn: train-tokenizer runs without it (1.3 s)
    import torch

#: A trained tokenizer (bpe, unigram, wordpiece) learns from at most this many characters of a
#: corpus, its first.
TOKENIZER_TRAIN_CHARS = 64 << 20


#: The messages of a corpus that is not the one the config or the run names.
_FINGERPRINT = (
    "the corpus is not the one data.fingerprint names ({want}…; now {got}…): a file was edited, added "
    "or removed; set data.fingerprint: null to train on it as it is now"
)


def ensure_corpus(
    cfg: Config,
    log: Callable[[str], None],
    progress: Optional[bool] = None,
    action: str = "minigpt uses",
) -> tuple[Config, Path]:
    """The named dataset's corpus file, downloaded (saying so), and ``cfg`` naming the dataset it
    holds: its fallback's where the default address cannot be reached
    (:func:`~.download.download_or_fallback`, whose note says "so {action} <fallback>"). Raises
    MinigptError: the download failed."""
    from .download import download_or_fallback

    dc = cfg.data
    log(f"{corpus_path(dc.data_dir, dc.dataset)} not found or incomplete; downloading it first")
    ds, path, _ = download_or_fallback(
        dc.dataset,
        dc.data_dir,
        url=dc.url,
        log=log,
        action=action,
        progress=progress,
        # A mirror the config names must serve the checksummed corpus itself.
        mirror_hint=(
            "fix data.url in the config (it overrides the environment): it must name a mirror of "
            f"the {dc.dataset} corpus itself, not another text (for your own text, set data.path "
            "instead)"
        )
        if dc.url
        else None,
    )
    if ds.name != dc.dataset:  # the run's config.yaml names the corpus it trained on
        cfg = cfg.model_copy(update={"data": dc.model_copy(update={"dataset": ds.name})})
    return cfg, path


def fallback_of(cfg: Config) -> Optional[str]:
    """The named corpus ``train`` falls back to for this config (data.dataset's registry
    ``fallback``); None for ``data.path``, a ``data.url`` mirror, or a dataset without one."""
    from .download import get_dataset

    dc = cfg.data
    return None if dc.path is not None or dc.url else get_dataset(dc.dataset).fallback


def on_run_corpus(cfg: Config, saved: Config) -> Config:
    """``cfg`` naming the corpus of the run it resumes (``saved``, its checkpoint's config) when
    that run trained on cfg's fallback (data.dataset's address was unreachable then): a resumed run
    continues on its own corpus, whichever address answers now."""
    if saved.data.path is None and saved.data.dataset == fallback_of(cfg):
        return cfg.model_copy(
            update={"data": cfg.data.model_copy(update={"dataset": saved.data.dataset})}
        )
    return cfg


def corpus_on_disk(cfg: Config, progress: Optional[bool] = False) -> Optional[Corpus]:
    """The config's corpus when it can be read without a download (``data.path``'s, or the named
    dataset's genuine file), hashed once; else None. Raises MinigptError: a ``data.path`` that names
    nothing readable."""
    from tqdm import tqdm

    from .download import get_dataset

    dc = cfg.data
    if dc.path is not None:
        with tqdm(
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc="hash corpus",
            leave=False,
            disable=None if progress is None else not progress,
        ) as bar:
            return open_corpus(dc.path, dc.text_field, on_bytes=bar.update)
    path, ds = corpus_path(dc.data_dir, dc.dataset), get_dataset(dc.dataset)
    if not path.is_file() or path.stat().st_size != ds.size:
        return None
    try:
        corpus = open_corpus(path, dc.text_field, name=dc.dataset)
    except (
        MinigptError
    ):  # unreadable: the download refuses it (the user's to fix) rather than replace it
        return None
    return corpus if corpus.files[0].sha256 == ds.sha256 else None


def corpus_root(cfg: Config, corpus: Optional[Corpus]) -> Path:
    """The folder of a corpus's tokenizers and token files: ``<data_dir>/<dataset>/``, or
    :meth:`Corpus.folder`."""
    dc = cfg.data
    return dataset_dir(dc.data_dir, dc.dataset) if dc.path is None else corpus.folder(dc.data_dir)


def configured_corpus(
    cfg: Config, log: Callable[[str], None], progress: Optional[bool] = None
) -> tuple[Corpus, Path]:
    """The corpus the config names (downloaded first when missing) and its folder
    (:func:`corpus_root`). Raises MinigptError: a ``data.path`` that names nothing readable, or a
    failed download."""
    corpus = corpus_on_disk(cfg, progress)
    if corpus is None:
        cfg, path = ensure_corpus(cfg, log, progress)
        corpus = open_corpus(path, cfg.data.text_field, name=cfg.data.dataset)
    return corpus, corpus_root(cfg, corpus)


#: A run's data.path corpus that is found neither where train read it nor from the current folder.
_RUN_CORPUS_GONE = (
    "run {run} trained on a corpus that is gone: nothing at {path} (data.path {given!r}, from "
    "{base}, where it trained); put the corpus back there"
)


def run_corpus_config(cfg: Config, run_dir: Path) -> Config:
    """A run's config with its corpus found from any folder (``data.data_dir``, ``data.path`` as
    ``train`` read them). Raises MinigptError: a ``data.path`` corpus found nowhere, naming where it
    was."""
    bases = run_env.training_dirs(run_dir, cfg.train.out_dir)
    if not bases:
        return cfg
    dc = cfg.data
    joined = [
        cfg.model_copy(
            update={
                "data": dc.model_copy(
                    update={
                        "data_dir": str(base / dc.data_dir),
                        "path": None if dc.path is None else str(base / dc.path),
                    }
                )
            }
        )
        for base in bases
    ]
    for there in (*joined, cfg):
        if _corpus_found(there):
            return there
    if dc.path is not None:
        raise MinigptError(
            _RUN_CORPUS_GONE.format(
                run=run_dir, path=joined[0].data.path, given=dc.path, base=bases[0]
            )
        )
    for base, there in zip(bases, joined):
        if base.is_dir():  # downloaded again where train had it, if that folder is still there
            return there
    return cfg


def _corpus_found(cfg: Config) -> bool:
    """Whether the config's corpus has files where it says: the named dataset's file, or
    ``data.path``'s."""
    dc = cfg.data
    return (
        corpus_path(dc.data_dir, dc.dataset).is_file()
        if dc.path is None
        else bool(matching(dc.path)[0])
    )


#: A run's corpus that changed since it trained, read by evaluate, compare or inspect.
_RUN_CORPUS_CHANGED = (
    "corpus file {path} was {what} since run {run} trained on it{detail}; its splits are read "
    "from the corpus as the run had it: restore that, or score the text as it is now with "
    "minigpt evaluate --text-file"
)


def corpus_change(before: list[dict], corpus: Corpus) -> tuple[str, str, str]:
    """What differs between a checkpoint's record of its corpus's files (``meta.json``) and
    ``corpus`` now: (path, ``changed``/``removed``/``added``/``reordered``, a changed file's sha256
    and size then and now)."""
    now_records = corpus.records()
    found = changed_file(before, now_records)
    if found is None:
        return corpus.source, "changed", ""
    path, what = found
    key = "name" if all("name" in r for r in [*before, *now_records]) else "path"
    now = next((r for r in now_records if r["path"] == path), None)
    old = (
        {r[key]: r for r in before}.get(now[key])
        if now is not None
        else next((r for r in before if r["path"] == path), None)
    )
    if (
        what == "removed" and key == "name" and old is not None and now_records
    ):  # where it was, moved or not
        root = Path(now_records[0]["path"]).parents[len(Path(now_records[0]["name"]).parts) - 1]
        path = str(root / old["name"])
    detail = (
        f" (sha256 {old['sha256'][:12]}…, {old['size']:,} bytes; now {now['sha256'][:12]}…, "
        f"{now['size']:,} bytes)"
        if old and now and what == "changed"
        else ""
    )
    return path, what, detail


def run_corpus_change(
    want: Optional[str],
    corpus: Corpus,
    run_dir: Path,
    checkpoints: Sequence[str] = (runs.BEST, runs.LAST),
) -> Optional[tuple[str, str, str]]:
    """None when ``corpus`` is the one ``want`` names (or none is named); else
    :func:`corpus_change`."""
    if want is None or corpus.matches(want):
        return None
    before: list[dict] = []
    for name in checkpoints:
        with suppress(MinigptError):  # no checkpoint there, or a damaged meta.json: the next one
            before = (
                runs.read_meta(runs.checkpoint_dir(run_dir, name)).get("corpus", {}).get("files")
                or []
            )
        if before:
            break
    return corpus_change(before, corpus)


def check_corpus(cfg: Config, corpus: Corpus, run_dir: Optional[Path] = None) -> None:
    """Refuse a corpus other than the one ``data.fingerprint`` names (when set); with ``run_dir``,
    the run's splits read from it, naming the file that differs. Raises MinigptError: the
    fingerprint names another corpus."""
    want = cfg.data.fingerprint
    if want is None or corpus.matches(want):
        return
    if run_dir is None:
        refusal = _FINGERPRINT.format(want=want[:12], got=corpus.fingerprint[:12])
    else:
        path, what, detail = run_corpus_change(want, corpus, run_dir)
        refusal = _RUN_CORPUS_CHANGED.format(path=path, what=what, run=run_dir, detail=detail)
    raise MinigptError(refusal)


def tokenizer_path(cfg: Config, root: Optional[Path] = None) -> Path:
    """``tokenizer.path``, else :func:`~minigpt_cli.paths.default_tokenizer_path` in ``root`` (the
    corpus's folder)."""
    tc = cfg.tokenizer
    if tc.path:
        return Path(tc.path)
    root = dataset_dir(cfg.data.data_dir, cfg.data.dataset) if root is None else root
    return default_tokenizer_path(root.parent, root.name, tc.kind, tc.vocab_size, tc.special_tokens)


#: How a tokenizer file can disagree with the config (checked in this order), and the fix.


#: The fix for a kind hf tokenizer file that cannot be read.
_HF_FIX = (
    "tokenizer.kind hf reads a Hugging Face tokenizer.json: fix tokenizer.path (or model.init_from)"
)


def load_configured_tokenizer(cfg: Config, path: Path) -> Tokenizer:
    """Load the tokenizer file ``path`` and check that it agrees with the config (kind, special
    tokens, size). Raises MinigptError: an unreadable file, or one that disagrees with the
    config."""
    tc = cfg.tokenizer
    # A tokenizer.path file is the user's: never advised to be deleted (own=False); the default file
    # is ours.
    tok = load_tokenizer(
        path, tc.kind, own=tc.path is None, fix=_HF_FIX if tc.kind == "hf" else None
    )
    missing = [s for s in tc.special_tokens if s not in tok.special_tokens]
    sized = (
        tc.kind != "char" and tc.vocab_size is not None
    )  # a char tokenizer's alphabet decides its size
    if tok.kind != tc.kind:
        raise MinigptError(
            f"tokenizer file {str(path)!r} holds a {tok.kind} tokenizer but tokenizer.kind is "
            f"{tc.kind}; fix tokenizer.path or tokenizer.kind"
        )
    if missing:
        raise MinigptError(
            f"tokenizer file {str(path)!r} lacks the special tokens {', '.join(map(repr, missing))} "
            "that tokenizer.special_tokens names; delete the file to train it again, or fix the "
            "config"
        )
    if sized and tok.vocab_size != tc.vocab_size:
        raise MinigptError(
            f"tokenizer file {str(path)!r} has {tok.vocab_size:,} entries but "
            f"tokenizer.vocab_size is {tc.vocab_size:,}; delete the file to train it again, or set "
            f"tokenizer.vocab_size: {tok.vocab_size}"
        )
    return tok


def training_texts(
    corpus: Corpus, special_tokens: Sequence[str], limit_chars: Optional[int] = None
) -> Iterator[str]:
    """Every piece of every document (about ``limit_chars`` characters at most), after a blank line
    when documents will be joined by one (its characters need ids)."""
    several = len(corpus.files) > 1 or any(f.by_documents for f in corpus.files)
    if several and not any(s in END_OF_TEXT for s in special_tokens):
        yield "\n\n"
    if limit_chars is not None:
        yield corpus_text(corpus, limit_chars)
        return
    for blocks, _ in documents(corpus):
        yield from cut_pieces(blocks, special_tokens=special_tokens)


def ensure_tokenizer(
    cfg: Config,
    corpus: Corpus | Path | None,
    log: Callable[[str], None],
    root: Optional[Path] = None,
    write: bool = True,
    save: bool = True,
) -> tuple[Optional[Tokenizer], Path]:
    """The configured tokenizer, checked, or trained on ``corpus`` and saved when its file is
    missing. ``write`` False (a dry run): nothing saved; a trained kind only has its size checked
    (None). ``save`` False: trained but kept in memory, for the caller to save once its own checks
    pass. Raises MinigptError: a file that disagrees with the config, a path that cannot be written,
    or training that fails; nothing is written then."""
    tc = cfg.tokenizer
    path = tokenizer_path(cfg, root)
    with errors_as({NotRegularFile: lambda exc: read_problem(exc, path, "tokenizer file")}):
        check_regular(path)  # a FIFO is neither a tokenizer to load nor a place to save one
    if path.is_file() or tc.kind == "hf":  # hf: a given file, never trained here
        return load_configured_tokenizer(cfg, path), path
    check_writable(path, folder=False)
    corpus = open_corpus(corpus) if isinstance(corpus, (str, Path)) else corpus
    if corpus is None or (not write and tc.kind != "char"):
        # Without the text, the base alphabet counts none of its characters: only a size no text
        # allows is refused.
        text = (
            "".join(training_texts(corpus, tc.special_tokens, TOKENIZER_TRAIN_CHARS))
            if corpus is not None and tc.kind not in ("bpe", "char")
            else ""
        )
        check_vocab_size(tc.kind, text, tc.vocab_size, tc.special_tokens)
        return None, path
    if write:
        size = f" with {tc.vocab_size:,} entries" if tc.kind != "char" and tc.vocab_size else ""
        log(
            f"tokenizer {path} not found; training a {tc.kind} tokenizer{size} on {corpus.source} first"
        )
    char = tc.kind == "char"  # learns from all of the corpus, streamed: every character needs an id
    texts = training_texts(corpus, tc.special_tokens, None if char else TOKENIZER_TRAIN_CHARS)
    tok = train_tokenizer(
        tc.kind,
        texts if char else "".join(texts),
        None if char else tc.vocab_size,
        tc.special_tokens,
    )
    if write and save:
        tok.save(path)
    return tok, path


@dataclass
class DataStage:
    """What ``train``'s data steps found or made; what a dry run lacks is None, and ``waits`` says
    why."""

    root: Path
    tok_path: Path
    corpus: Optional[Corpus] = None
    tok: Optional[Tokenizer] = None
    data: Optional[PreparedData] = None
    trained: bool = False
    waits: Optional[str] = None
    fallback: Optional[str] = None  # the dataset used where data.dataset's could not be reached


def prepare_data(
    cfg: Config,
    log: Callable[[str], None],
    progress: Optional[bool] = None,
    write: bool = True,
    check: Callable[[Corpus], None] = lambda corpus: None,
    found: Callable[[Optional[Corpus]], None] = lambda corpus: None,
    check_tokenizer: Callable[[Optional[Tokenizer]], None] = lambda tok: None,
) -> DataStage:
    """``train``'s data steps and ``minigpt prepare``: the corpus, tokenizer and token files, each
    made if missing (``write`` False: ``--dry-run``, nothing written). ``found`` hears of the corpus
    on disk (None: not there) before any download; ``check`` may refuse it, and
    ``check_tokenizer`` the tokenizer (None: not trained yet, in a dry run) before a tokenizer
    trained here or the token files are written. Raises MinigptError: as the steps and the checks
    do."""
    dc, named = cfg.data, cfg.data.dataset
    corpus = corpus_on_disk(cfg, progress)
    found(corpus)
    if corpus is None:
        check_writable(dataset_dir(dc.data_dir, dc.dataset), folder=True)  # where the download goes
        if write:
            cfg, path = ensure_corpus(cfg, log, progress, "training uses")  # cfg names a fallback
            corpus = open_corpus(path, dc.text_field, name=cfg.data.dataset)
    root = corpus_root(cfg, corpus)
    if corpus is not None:
        check(corpus)
    tok_path = tokenizer_path(cfg, root)
    trained = not tok_path.is_file()
    # A tokenizer trained here is saved only after the token files are made: a corpus the split
    # refuses (too small) leaves no tokenizer, nor its folder, behind.
    tok, _ = ensure_tokenizer(cfg, corpus, log, root, write, save=False)
    check_tokenizer(tok)
    stage = DataStage(root, tok_path, corpus, tok, trained=trained)
    if cfg.data.dataset != named:
        stage.fallback = cfg.data.dataset
    if corpus is None:
        stage.waits = (
            f"{corpus_path(dc.data_dir, dc.dataset)} is not downloaded (or fails its checksum); "
            "train downloads it first"
        )
    elif tok is None:
        stage.waits = f"the {cfg.tokenizer.kind} tokenizer is not trained yet; train trains it into {tok_path} first"
    else:
        stage.data = prepare(
            corpus,
            tok,
            root,
            dc.val_fraction,
            log=log,
            progress=progress,
            block_size=cfg.model.block_size,
            write=write,
        )
        if "train_tokens" not in stage.data.meta:
            stage.waits = (
                f"the corpus ({corpus.size / 1e6:,.0f} MB) is not prepared yet and too large to encode "
                "for a preview; train prepares it first"
            )
    if write and trained and tok is not None:
        tok.save(tok_path)
    return stage


def prepare_configured(
    cfg: Config, log: Callable[[str], None] = print, progress: Optional[bool] = None
):
    """``minigpt prepare``: :func:`prepare_data`'s corpus, tokenizer, its file and token files."""
    stage = prepare_data(cfg, log, progress)
    return stage.corpus, stage.tok, stage.tok_path, stage.data


def with_vocab(cfg: Config, vocab_size: int) -> Config:
    """``cfg`` with a null ``model.vocab_size`` taken from the tokenizer's. Raises MinigptError: a
    smaller one."""
    mc = cfg.model
    if mc.vocab_size is None:
        mc = mc.model_copy(update={"vocab_size": vocab_size})
    elif mc.vocab_size < vocab_size:
        raise MinigptError(
            f"model.vocab_size ({mc.vocab_size}) is smaller than the tokenizer's {vocab_size} entries; "
            "set model.vocab_size: null to take it from the tokenizer"
        )
    return cfg.model_copy(update={"model": mc})


class BatchSampler:
    """Random (x, y) windows from a token memmap, by a ``torch.Generator`` of its own.

    ``sizes`` (optimizer step -> (sequences, tokens per window)) gives each step's shape, for the
    batch-size ramp and the sequence-length warmup; the step of a micro-batch is the count drawn
    before it over ``accum``. None: ``batch_size`` windows of ``block_size`` at every step."""

    def __init__(
        self,
        tokens: np.ndarray,
        block_size: int,
        batch_size: int,
        seed: int,
        device: torch.device,
        rank: int = 0,
        world: int = 1,
        sizes: Optional[Callable[[int], tuple[int, int]]] = None,
        accum: int = 1,
    ):
        import torch

        assert len(tokens) > block_size, "prepare's check_split_counts refuses a shorter split"
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size
        self.device = device
        self.generator = torch.Generator().manual_seed(seed)
        # Every rank draws the same global batch and keeps its own slice, so a
        # run on N processes sees exactly the data of one process with N times the batch.
        self.rank, self.world = rank, world
        self.sizes, self.accum = sizes, accum
        self.drawn = 0  # micro-batches drawn so far

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: (batch, block) int64, y shifted by one position; (batch_size, block_size) unless
        ``sizes`` says otherwise for this micro-batch's step."""
        import torch

        batch, block = self.batch_size, self.block_size
        if self.sizes is not None:
            batch, block = self.sizes(self.drawn // self.accum)
        self.drawn += 1
        ix = torch.randint(
            len(self.tokens) - block,
            (batch * self.world,),
            generator=self.generator,
        )
        ix = ix[self.rank * batch : (self.rank + 1) * batch]
        return windows(self.tokens, ix, block, self.device)

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor, step: int = 0) -> None:
        """Go on from generator ``state``, taken when optimizer step ``step`` was next."""
        self.generator.set_state(state)
        self.drawn = step * self.accum


def windows(
    tokens: np.ndarray, offsets: torch.Tensor, block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of ``tokens`` at ``offsets`` (n,): x, y (n, block_size) int64 on ``device``, y
    shifted by one."""
    import torch

    window = torch.from_numpy(
        tokens[offsets.numpy()[:, None] + np.arange(block_size + 1)].astype(np.int64)
    )
    x, y = window[:, :-1], window[:, 1:]
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(
            device, non_blocking=True
        )
    return x.to(device), y.to(device)


def full_windows(n_tokens: int, block_size: int, stride: int) -> Iterator[tuple[int, int, int]]:
    """(begin, end, scored) of each window over ``n_tokens`` tokens: it reads ``begin .. end - 1``
    and scores the last ``scored`` of its predictions; together they score every token after the
    first exactly once."""
    done = 1  # tokens scored so far, counting the first, which nothing predicts
    begin = 0
    while done < n_tokens:
        end = min(begin + block_size + 1, n_tokens)  # block_size inputs and their next tokens
        yield begin, end, end - done
        done = end
        begin += stride


def span_batch(
    tokens: np.ndarray, spans: Sequence[tuple[int, int, int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y (len(spans), the longest span's inputs) int64 on ``device`` for spans (begin, end,
    scored) of :func:`full_windows`: each row reads ``tokens[begin:end - 1]``, left-aligned; y holds
    the next tokens of its last ``scored`` inputs and -1 elsewhere (the loss's ``ignore_index``)."""
    import torch

    width = max(end - begin for begin, end, _ in spans) - 1
    x = torch.zeros((len(spans), width), dtype=torch.long)
    y = torch.full((len(spans), width), -1, dtype=torch.long)
    for row, (begin, end, scored) in enumerate(spans):
        window = torch.from_numpy(tokens[begin:end].astype(np.int64))
        x[row, : end - begin - 1] = window[:-1]
        if scored:
            y[row, end - begin - 1 - scored : end - begin - 1] = window[-scored:]
    return x.to(device), y.to(device)


def full_eval_batches(
    tokens: np.ndarray, block_size: int, batch_size: int, rank: int, world: int, device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One process's share of a split scored whole (``train.eval_full_val``): the windows of
    :func:`full_windows` with stride ``block_size`` (every token after the first scored once, with
    0 to ``block_size - 1`` tokens before it in its window), ``batch_size`` at a time; process
    ``rank`` takes every ``world``-th batch. Every process yields :func:`full_eval_steps` batches
    (FSDP's forward is a collective): one left without windows reads the first window with no
    target scored (y all -1)."""
    spans = list(full_windows(len(tokens), block_size, block_size))
    groups = [spans[i : i + batch_size] for i in range(0, len(spans), batch_size)]
    for i in range(full_eval_steps(len(tokens), block_size, batch_size, world)):
        index = i * world + rank
        if index < len(groups):
            yield span_batch(tokens, groups[index], device)
        else:
            begin, end, _ = spans[0]
            yield span_batch(tokens, [(begin, end, 0)], device)


def full_eval_steps(n_tokens: int, block_size: int, batch_size: int, world: int) -> int:
    """The batches each process reads in :func:`full_eval_batches`: ⌈windows / batch_size /
    world⌉, with ⌈(n_tokens − 1) / block_size⌉ windows."""
    n_windows = math.ceil((n_tokens - 1) / block_size)
    return math.ceil(math.ceil(n_windows / batch_size) / world)


#: Eval offsets are drawn this many at a time: memory stays bounded whatever ``eval_iters`` asks
#: for.
EVAL_CHUNK = 4096


def eval_offsets(n_tokens: int, block_size: int, count: int, seed: int) -> Iterator[torch.Tensor]:
    """The start offsets of an eval's ``count`` windows, in chunks of :data:`EVAL_CHUNK`; a function
    of the seed."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    for start in range(0, count, EVAL_CHUNK):
        yield torch.randint(
            n_tokens - block_size, (min(EVAL_CHUNK, count - start),), generator=generator
        )


def eval_seed(seed: int, split: str, step: int) -> int:
    """The seed of the eval batches of ``split`` at ``step`` (a resumed run evaluates as the
    uninterrupted one)."""
    return ((seed * 1_000_003 + {"train": 2, "val": 3}[split]) * 1_000_000_007 + step) & (2**63 - 1)
