"""Many runs: :mod:`.sweepfile` reads a sweep file, :mod:`.sweep` trains its variants (:mod:`.jobs`
its runs, :mod:`.search` a search's trials), :mod:`.compare` sets runs side by side (:mod:`.noise`
says whether a difference exceeds the seed noise, :mod:`.trials` lists a study's trials) and
:mod:`.plot` draws their curves."""
