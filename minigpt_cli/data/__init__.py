"""Text in, token files out: the corpus, its download, the split, the prepared memmaps and the
batches."""
