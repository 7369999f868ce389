"""Launchers: batch scripts that run ``torchrun -m minigpt_cli train`` on a cluster's machines.

One module per scheduler (:mod:`.slurm`); each checks its inputs and the config once, then writes
a script that starts the same training command on every machine. Nothing here imports torch.
"""
