"""The run folder: its layout and lock, checkpoints, and the logs a run writes.

- :mod:`.folder`: the one place that spells the run folder's names; finding, naming and locking runs;
- :mod:`.checkpoint`: atomic, self-describing checkpoints and when a run saves;
- :mod:`.metrics`: ``metrics.jsonl``, ``train.log``, ``loss.png``, ``samples.txt``.
"""
