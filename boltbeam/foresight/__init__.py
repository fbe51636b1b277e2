"""What the CPU knows of a setting before a GPU runs it: whether the chip's facts allow it (BubbleBeam, space.py)
and what it should cost (FutureSight, future.py). The route families declare their terms with it; the search
orders its candidates by it."""
