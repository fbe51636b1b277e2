"""Where did each microsecond go? The tie-out of one token (tieout) and two traces region by region (compare)."""
from boltbeam.account.compare import Comparison, Region, compare
from boltbeam.account.tieout import Account, Line, account

__all__ = ["Account", "Comparison", "Line", "Region", "account", "compare"]
