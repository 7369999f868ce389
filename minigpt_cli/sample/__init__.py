"""Sampling from a trained model: the sampler, KV-cache decoding, compiled decoding, the
``generate`` command.

- :mod:`.sampling`: temperature, top-k, top-p, the sliding window, the decoding loop;
- :mod:`.decoding`: the KV caches and the decoders behind one prefill/step interface (no cache,
  the growing cache, the static cache with its compiled one-token step: gpt-fast's way);
- :mod:`.load`: :func:`~.load.load_run`, a finished run's model, tokenizer and config, checked
  against each other;
- :mod:`.generate`: the ``generate`` command as a function.
"""
