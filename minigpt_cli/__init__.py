"""minigpt: train, sample and measure small GPT models from the command line."""

__version__ = "0.1.0"
