"""ACLs: which principal may do what to which queue or group. Pure: rules in, decisions out.

A rule is ``{"principal", "operation", "resource"}``: ``operation`` one of ``produce``,
``consume``, ``admin``; ``resource`` a queue name, a prefix ending in ``*`` (``orders.*``,
``*`` for every queue), or ``group:NAME`` / ``group:PREFIX*`` for consumer groups. Once
authentication is on, everything not allowed by a rule is refused (deny by default). ``admin``
on a queue also allows ``produce`` and ``consume`` on it; ``admin`` on ``*`` allows managing
ACLs. A consumer in a group needs ``consume`` on the queue and on ``group:<group>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fabric.errors import BadParameter

OPERATIONS = ("produce", "consume", "admin")
GROUP_PREFIX = "group:"


@dataclass(frozen=True, slots=True)
class Rule:
    principal: str
    operation: str
    resource: str

    @classmethod
    def checked(cls, principal: str, operation: str, resource: str) -> Rule:
        if not isinstance(principal, str) or not principal or len(principal) > 200:
            raise BadParameter("an ACL names a principal (a client name from `fabric auth add-client`)")
        if operation not in OPERATIONS:
            raise BadParameter(f"ACL operation must be one of {', '.join(OPERATIONS)}, got {operation!r}")
        if not isinstance(resource, str) or not resource or len(resource) > 210 or "*" in resource[:-1]:
            raise BadParameter(f"ACL resource {resource!r}: a queue name, a prefix ending in '*', or group:NAME")
        return cls(principal, operation, resource)

    def to_json(self) -> dict[str, str]:
        return {"principal": self.principal, "operation": self.operation, "resource": self.resource}

    @classmethod
    def from_json(cls, d: Mapping[str, str]) -> Rule:
        return cls.checked(d["principal"], d["operation"], d["resource"])


def _matches(pattern: str, name: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern


class Acl:
    """The rules in force, indexed by principal."""

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self.rules: list[Rule] = []
        self._by: dict[str, list[Rule]] = {}
        for r in rules:
            self.add(r)

    def add(self, rule: Rule) -> bool:
        if rule in self.rules:
            return False
        self.rules.append(rule)
        self._by.setdefault(rule.principal, []).append(rule)
        return True

    def remove(self, rule: Rule) -> bool:
        if rule not in self.rules:
            return False
        self.rules.remove(rule)
        self._by[rule.principal].remove(rule)
        return True

    def allows(self, principal: str, operation: str, resource: str) -> bool:
        """``resource``: a queue name, or ``group:NAME``."""
        for r in self._by.get(principal, ()):
            if (r.operation == operation or r.operation == "admin") and _matches(r.resource, resource):
                return True
        return False
