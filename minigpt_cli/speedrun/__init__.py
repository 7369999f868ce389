"""``minigpt speedrun``: a fixed task (a track's target val on Tiny Shakespeare), a rule for what
counts as a record, and the ledger of records.

:mod:`.tracks` reads the shipped track table, :mod:`.runner` trains a recipe at several seeds as
``minigpt train`` processes and does the statistics, :mod:`.baseline` runs nanoGPT's CPU recipe
beside it, and :mod:`.ledger` keeps ``speedrun/records.md`` and the recipes of its records.
"""
