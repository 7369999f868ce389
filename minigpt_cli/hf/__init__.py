"""Hugging Face ``transformers`` folders both ways: :mod:`.load` (import), :mod:`.export`, :mod:`.finetune`."""
