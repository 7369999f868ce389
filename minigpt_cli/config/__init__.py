"""The config: one strict pydantic schema, validated once at the edge, and what ships with it.

- :mod:`.schema`: the sections (``model``, ``data``, ``tokenizer``, ``train``, ``sample``), ``--set``, :func:`~.schema.load_config`;
- :mod:`.yaml_io`: the strict YAML loader and dumper;
- :mod:`.messages`: the one-line texts for a config that fails validation;
- :mod:`.keys`: the ``config-keys`` reference, generated from the schema;
- :mod:`.special_tokens`: the configured special tokens, and cutting text around them;
- :mod:`.notes`: what a config sets that cannot take effect;
- ``presets/``, ``configs/``, ``datasets.json``: the shipped model sizes, example configs and corpora.

No torch here: ``--help`` and ``count-params`` load configs without it.
"""
