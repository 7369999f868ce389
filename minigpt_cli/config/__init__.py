"""The config: one strict pydantic schema, its messages, notes and key reference, and what ships
with it."""
