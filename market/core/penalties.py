"""The market's fixed reputation penalties: the one place they are defined (docs/world.md, Labs).

Money penalties (shill, withdrawal, collusion) are mechanism fields the designer sets; these
reputation losses are rules of the market and never change within or between episodes.
"""

from __future__ import annotations

#: a seller short by ``s`` of ``b`` blocks on a forward contract loses ``BREACH_REPUTATION_LOSS * s / b``
#: (and so does a coalition member short by ``s`` of the ``b`` blocks it pledged to the pool)
BREACH_REPUTATION_LOSS = 0.05
#: a lab leaving an active coalition before its term ends loses this much
COALITION_EXIT_REPUTATION_LOSS = 0.1
#: a lab whose pitch the judge finds a false claim in loses this much at clearing; the market's
#: audit (``market.core.audit``) charges the same for each claim the conduct judge found false
FALSE_CLAIM_REPUTATION_LOSS = 0.05
#: the market's audit: a lab loses this much for each promise in words the conduct judge decided
#: broken at a round's close (promises the market already charges, breaches and exits, excepted)
BROKEN_PROMISE_REPUTATION_LOSS = 0.05
