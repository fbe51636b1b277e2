"""What fixing it could return, in time and in money.

price per token = GPU cost per hour / (3,600 x tokens per second). The hourly price is a target fact
(`price_per_hour`, USD/h, with its source and date) or the user's `--price-per-hour`. Every account
line that holds time above its floor gets its what-if: the token, tokens/s and cost per million
tokens if that line alone sat at its floor (its time above the floor removed from the wall).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from boltbeam.account.tieout import Account
from boltbeam.bound.targets import PLAUSIBLE, Target
from boltbeam.errors import BadInput

PRICE_FACT = "price_per_hour"
# Lines whose positive time is a cost a fix could remove; floor and overlap lines are not.
REMOVABLE_KINDS = ("role", "boundary", "gap", "launch")


@dataclass(frozen=True)
class Price:
    usd_per_hour: float
    source: str
    date: str | None = None


@dataclass(frozen=True)
class Rate:
    """One token time seen three ways."""
    token_us: float
    tok_s: float
    usd_per_mtok: float | None   # None without a price

    @classmethod
    def of(cls, token_us: float, price: Price | None) -> "Rate":
        tok_s = 1e6 / token_us
        return cls(token_us, tok_s, None if price is None else cost_per_mtok(tok_s, price.usd_per_hour))


@dataclass(frozen=True)
class WhatIf:
    label: str          # the account line's label
    saves_us: float     # the line's time above its floor (no more than the token's above its own)
    at_floor: Rate      # the token if that line sat at its floor


@dataclass(frozen=True)
class Returns:
    """The audit's money: measured, at the ceiling, and each line's what-if, biggest saving first."""
    price: Price | None
    measured: Rate
    ceiling: Rate
    whatifs: list[WhatIf]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cost_per_mtok(tok_s: float, usd_per_hour: float) -> float:
    """USD per million tokens at tok_s tokens per second on a device that costs usd_per_hour."""
    return usd_per_hour / (3600 * tok_s) * 1e6


def price_of(target: Target, override: float | None) -> Price | None:
    """`--price-per-hour` when given, else the target's fact, else no price (time only)."""
    if override is not None:
        low, high = PLAUSIBLE["price"]
        if not low <= override <= high:   # NaN fails too
            raise BadInput(f"--price-per-hour must be between {low:g} and {high:g} USD/h, not {override:g}")
        return Price(float(override), "--price-per-hour")
    fact = target.facts.get(PRICE_FACT)
    return None if fact is None else Price(fact.value, fact.source, fact.date)


def returns(acc: Account, price: Price | None) -> Returns:
    # Never faster than the token's floor: a line inflated past the wall saves at most the rest.
    whatifs = []
    for line in acc.lines:
        if line.kind in REMOVABLE_KINDS and line.us > 0:
            token = max(acc.wall_us - line.us, acc.floor_us)
            whatifs.append(WhatIf(line.label, acc.wall_us - token, Rate.of(token, price)))
    return Returns(price, Rate.of(acc.wall_us, price), Rate.of(acc.floor_us, price),
                   sorted(whatifs, key=lambda w: -w.saves_us))
