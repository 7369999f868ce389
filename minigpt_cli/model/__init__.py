"""The decoder-only Transformer, architecture only: it imports nothing of the package but
the config.

- :mod:`.gpt`: the GPT, its blocks and variants (the KV caches that decode it are
  :mod:`minigpt_cli.sample.decoding`'s).
"""
