"""Text in, token files out: the corpus, its download, the split, the prepared memmaps and the batches.

- :mod:`.download` (and :mod:`.download_files`): a named corpus fetched, checksummed, written atomically;
- :mod:`.corpus`: the documents ``data.path`` names, read as a stream;
- :mod:`.preparation`: the one train/val split, its refusal, and the token memmaps;
- :mod:`.pipeline`: the config's corpus and tokenizer made ready, and the batches drawn for training;
- :mod:`.train_tokenizer`: the ``train-tokenizer`` command.
"""
