"""Exact parameter, FLOP and memory accounting from a model config: arithmetic only, no torch.

- :mod:`.params`: parameters and FLOPs per token; :mod:`.memory`: training memory with AdamW;
- :mod:`.report`: the ``count-params`` table; :mod:`.count`: the ``count-params`` command.
"""
