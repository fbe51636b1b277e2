"""The KV depth a command is asked for, checked against the model before anything is built for it: a
prompt of --context tokens is a list in memory (10**8 of them are gigabytes), and a cache sized past the
model's context length holds positions the model was never made to read."""
from __future__ import annotations

from boltbeam.errors import BadInput

# The most positions any run may ask for where the model does not say its context length (the longest
# contexts models are made for are a few million tokens).
MOST_POSITIONS = 1 << 24


def check_depth(census, context: int, decoded: int = 0) -> None:
    """Refuse `context` positions (and `decoded` tokens after them) past the model's context length."""
    limit = census.facts.context_length or MOST_POSITIONS
    whose = f"{census.path}'s context length" if census.facts.context_length else "the most BoltBeam runs"
    if context < 0 or decoded < 0:
        raise BadInput(f"--context {context} and the tokens decoded must be 0 or more")
    if context + decoded > limit:
        after = f" and {decoded:,} tokens decoded after it" if decoded else ""
        raise BadInput(f"--context {context:,}{after} is past {whose}, {limit:,} positions")
