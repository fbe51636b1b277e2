"""Test helper: append COUNT entries to the ledger at PATH as ACTOR, printing each id once committed.

    python tests/ledger_writer.py PATH COUNT ACTOR
"""
import sys

from boltbeam.ledger.store import Ledger


def main(path: str, count: int, actor: str) -> None:
    with Ledger(path) as ledger:
        for i in range(count):
            entry_id = ledger.append(candidate=f"{actor}-{i}", verdict="diagnostic", reasons=[f"Append {i}."],
                                     scope={"writer": actor}, evidence=[], reopen=None, actor=actor)
            print(entry_id, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
