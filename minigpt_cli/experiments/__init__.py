"""Many runs: :mod:`.sweep` trains the variants of a sweep file, :mod:`.compare` sets runs side by
side."""
