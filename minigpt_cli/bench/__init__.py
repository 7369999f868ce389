"""``minigpt bench``: measured in one process, as ratios in one run.

- :mod:`.throughput`: training tokens/s and MFU against a matmul peak measured in the same run;
- :mod:`.generation`: generation tokens/s without the cache, with it, compiled and batched;
- :mod:`.prepare`: data preparation against a bare ``encode_batch`` loop.
"""
