"""Faster kernels for the model's layers, swapped into a built model by whoever wants them.

The model (:mod:`minigpt_cli.model`) is architecture only and computes with
PyTorch's own modules. A command that wants another kernel replaces the
modules after building the model: the trainer, ``bench`` and ``generate``
call :func:`~minigpt_cli.kernels.onednn.swap_linears`. A swapped module keeps
the same parameters (the same tensors), so state-dict keys, weight tying and
checkpoints are unchanged.
"""
