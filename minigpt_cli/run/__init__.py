"""The run folder (:mod:`.folder`), its checkpoints (:mod:`.checkpoint`) and its logs
(:mod:`.metrics`)."""
