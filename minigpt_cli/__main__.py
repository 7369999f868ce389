"""``python -m minigpt_cli`` (and ``torchrun -m minigpt_cli``) runs the CLI."""

from .cli import main

main()
