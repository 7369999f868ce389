"""Sampling from a trained model: the sampler, KV-cache decoding, compiled decoding, the ``generate`` command.

- :mod:`.sampling`: temperature, top-k, top-p, the sliding window;
- :mod:`.decoding`: the static KV cache and the compiled one-token step (gpt-fast's way);
- :mod:`.generate`: the ``generate`` command as a function.
"""
