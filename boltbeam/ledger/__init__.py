"""Have we been here before? The ledger is an append-only, hash-chained record of verdicts on
candidates (store.py), so nobody pays twice for a refuted idea: the search asks
`Ledger.should_skip` and skips what was refuted until its reopen condition (reopen.py) is met."""
