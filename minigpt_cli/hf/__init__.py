"""Hugging Face ``transformers`` folders both ways: :mod:`.load` (import), :mod:`.export`,
:mod:`.finetune`; and :mod:`.gguf`, one GGUF file for llama.cpp."""
