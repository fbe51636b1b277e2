"""BoltBeam keeps the books for LLM decode: read, bound, measure, account, judge, record, search."""
__version__ = "0.1.0"
