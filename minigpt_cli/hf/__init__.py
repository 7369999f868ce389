"""Hugging Face ``transformers`` folders, both ways.

- :mod:`.load`: GPT-2 and Llama weights read into our GPT;
- :mod:`.export`: a run written as a ``transformers`` folder;
- :mod:`.finetune`: a run that starts from such a folder (``model.init_from``).
"""
