"""The config: one strict pydantic schema (:mod:`.schema`), validated once at the edge, its messages, notes and
key reference, and what ships with it (``presets/``, ``configs/``, ``datasets.json``). No torch here.
"""
