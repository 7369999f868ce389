"""``minigpt bench``: training, generation (:mod:`.generation`) and preparation (:mod:`.prepare`)
speed."""
