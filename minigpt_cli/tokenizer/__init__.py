"""Tokenizers behind one interface: char, byte-level BPE, WordPiece, Unigram, and Hugging Face
files.

- :mod:`.base`: the :class:`~.base.Tokenizer` protocol and what is computed over any tokenizer;
- :mod:`.kinds`: the five kinds, loading and saving;
- :mod:`.training`: training the library-backed kinds; :mod:`.wordpiece`: our WordPiece trainer.
"""
