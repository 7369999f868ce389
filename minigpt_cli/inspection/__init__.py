"""``minigpt inspect``: the ideas behind the model, computed, checked and drawn, one module per
topic.

Each topic returns its numbers as a dict (what ``--json`` prints), draws a PNG into an output folder
and has a ``format_*`` text form. Nothing is imported here, so the CLI can list the topics without
torch.
"""
