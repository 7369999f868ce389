"""The decoder-only Transformer, architecture only: it imports nothing of the package but the config.

- :mod:`.gpt`: the GPT, its blocks and variants, and the growing KV cache.
"""
