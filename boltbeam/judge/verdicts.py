"""The eight verdicts. Every judgement and every ledger entry is exactly one of them."""

DIAGNOSTIC = "diagnostic"                          # a measurement, no claim about a change
CANDIDATE = "candidate"                            # worth timing; not judged yet
PROMOTE = "promote"                                # every gate passed: may become the default
REFUTE = "refute"                                  # a gate failed firmly
DEFER = "defer"                                    # a win blocked by a missing capability
INCONCLUSIVE = "inconclusive"                      # a gate had no evidence, or the effect is inside noise
SEARCH_SPACE_INCOMPLETE = "search-space-incomplete"  # the search space cannot express it yet
ADAPTER_INCOMPLETE = "adapter-incomplete"          # the evidence cannot be read safely

VERDICTS = (DIAGNOSTIC, CANDIDATE, PROMOTE, REFUTE, DEFER, INCONCLUSIVE,
            SEARCH_SPACE_INCOMPLETE, ADAPTER_INCOMPLETE)

# A verdict that closes an idea must say when it may be tried again.
NEEDS_REOPEN = (REFUTE, SEARCH_SPACE_INCOMPLETE)

