"""What a tenant principal may read of another tenant: nothing (docs/security.md "Isolation").

A decision that gave up replicas to other tenants says who took them ("preempted by tenant gold
(priority 100): granted 4 of 7", :mod:`controlplane.core.grant_reasons`), and admins read it so.
A tenant principal reads the same sentence with every other tenant's name and priority replaced
by "a higher-priority tenant": it learns why its grant fell, not who else runs on the fleet. The
replicated text is never changed; this is applied where a message leaves the API (decisions in
Explain, decision events in Watch, the Preempted condition of a deployment).
"""

from __future__ import annotations

import re

from controlplane.api.auth import Principal

_CLAUSE = re.compile(r"preempted by (?P<takers>.*?): granted")
_TAKER = re.compile(r"tenant (?P<name>[a-z0-9][a-z0-9-]*)(?: \(priority \d+\))?(?P<count> x\d+)?")
OTHER = "a higher-priority tenant"


def for_principal(p: Principal, text: str) -> str:
    """``text`` as ``p`` may read it (unchanged for admins and for text that names no taker)."""
    if p.is_admin or "preempted by " not in text:
        return text

    def takers(m: re.Match[str]) -> str:
        own: list[str] = []
        others, counted = 0, 0
        for t in _TAKER.finditer(m.group("takers")):
            if t.group("name") == p.tenant:
                own.append(t.group(0))
            else:
                others += 1
                counted += int(t.group("count")[2:]) if t.group("count") else 0
        if not others:
            return m.group(0)
        other = OTHER if others == 1 else "higher-priority tenants"
        if counted and (own or others > 1):
            other += f" x{counted}"
        return f"preempted by {', '.join([*own, other])}: granted"

    return _CLAUSE.sub(takers, text)
