"""``minigpt inspect``: the ideas behind the model, computed, checked and drawn.

One module per topic; each offers a function that returns the topic's
numbers as a plain dict (what ``--json`` prints) and, given an output folder,
draws a PNG there, plus a ``format_*`` function for the text form:

- :mod:`.positions`: the sinusoidal table, p0·pk, the rotation p(t+k) = R_k p(t), RoPE after projections;
- :mod:`.block`: our Pre-LN and Post-LN blocks against ``torch.nn.TransformerEncoderLayer``, shape traces;
- :mod:`.residual`: the residual stream's RMS with depth, with and without the 1/sqrt(2L) init;
- :mod:`.attention`: a trained run's attention maps and each head's entropy;
- :mod:`.activations`: ReLU, GELU, GELU-tanh and SiLU, and GELU's tanh approximation error;
- :mod:`.ffn`: a tiny feed-forward pass step by step, and SwiGLU's 2/3 width rule;
- :mod:`.tokenize`: pieces and ids, BPE and WordPiece merges, Unigram's segmentations.

Nothing is imported here, so the CLI can list the topics without torch.
"""
