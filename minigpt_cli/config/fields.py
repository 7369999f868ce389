"""The config schema's shared parts: the strict base of every section, the bounds on sizes and
counts, and the path types (:mod:`.schema` builds the sections on them). No torch here."""

from __future__ import annotations

import os
from typing import Annotated, Any, Iterator, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

#: Upper bounds of the sizes and counts: far past any model trained today (Llama 3 405B: 126 layers, width 16,384),
#: and small enough that the arithmetic on them stays in floats; within them, the memory check refuses what won't fit.
MAX_LAYERS = MAX_BATCH = 1 << 30
MAX_WIDTH = MAX_HEADS = MAX_TOKENS = MAX_VOCAB = 1 << 20
MAX_STEPS = MAX_SECONDS = 10**12
MAX_SAMPLES = 1024


class _Strict(BaseModel):
    # allow_inf_nan=False: `.inf` or `.nan` (or "inf" through --set) is never a usable setting.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, allow_inf_nan=False, strict=True
    )

    def _broken(self) -> Iterator[str]:  # the section's broken cross-field rules, one message each
        return iter(())

    @model_validator(mode="before")
    @classmethod
    def _whole_floats(cls, data: Any) -> Any:
        """A float with a whole value (``1e4``, ``5000.0``) given to an integer key is that integer:
        YAML and ``--set`` read ``1e4`` as a float. ``1.5`` stays a float, and is refused."""
        if not isinstance(data, dict):
            return data
        return {
            key: int(value)
            if isinstance(value, float)
            and value.is_integer()
            and key in cls.model_fields
            and cls.model_fields[key].annotation in (int, Optional[int])
            else value
            for key, value in data.items()
        }

    @model_validator(mode="after")
    def _check_rules(self) -> "_Strict":
        broken = list(self._broken())
        if (
            broken
        ):  # every broken rule at once, one per line (format_error makes each its own problem)
            raise ValueError("\n".join(broken))
        return self


#: A path from the config: ``~`` means the home folder, as in a shell (a literal ``~`` folder would
#: surprise, and the hints minigpt prints would point elsewhere once pasted into a shell).
UserPath = Annotated[str, AfterValidator(os.path.expanduser)]
#: A folder the tool writes into: never empty (``--set train.out_dir=`` would write into the current
#: folder).
FolderPath = Annotated[str, Field(min_length=1), AfterValidator(os.path.expanduser)]
