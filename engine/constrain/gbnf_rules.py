"""GBNF rules as gbnf.py parses them, and the checks that make them a grammar.

A rule's body is its alternatives, each a sequence of elements: (TERMINAL, a 256-bit byte mask)
or (REF, a rule); END closes each alternative once gbnf.py flattens them into a Program. They are
defined here, below gbnf.py, so the parser and the checks read one definition.

The checks, run once the text is parsed: every rule used is defined, a rule named `root` is,
every named rule matches some finite text (alternatives that never finish are dropped), and no
rule is left-recursive (directly, through other rules, or through rules that can match nothing,
as llama.cpp rejects it). Each failure is the error `Rules.invalid` makes at the rule at fault.
"""

from __future__ import annotations

from typing import NoReturn, Protocol

from engine.errors import InvalidInput

# Element kinds; a terminal's value is a 256-bit byte mask, a reference's a rule, a members
# element's an entry of Program.members (tree_grammar.py writes them, after the checks).
TERMINAL, REF, END, MEMBERS = 0, 1, 2, 3

Element = tuple[int, int]
Alternative = list[Element]


class Rules(Protocol):
    """What the checks read of the parsed rules."""

    ids: dict[str, int]  # named rules: name -> rule
    names: list[str]  # every rule's name (a repetition's or a group's is made up)
    bodies: list[list[Alternative] | None]  # None: used, never defined
    offsets: list[int]  # where each rule was defined (or first used)
    repeats: set[int]  # rules a repetition made

    def invalid(self, offset: int, message: str) -> InvalidInput:
        """The error for a grammar at fault at `offset` of its text."""
        ...


def checked_bodies(rules: Rules) -> list[list[Alternative]]:
    """Check the parsed rules (defined, root, productive, no left recursion); their bodies without
    the alternatives that can never finish."""
    for rule, body in enumerate(rules.bodies):
        if body is None:
            raise rules.invalid(rules.offsets[rule], f"rule '{rules.names[rule]}' is not defined")
    if "root" not in rules.ids:
        raise rules.invalid(0, "no rule named 'root' (the start rule)")
    bodies = _productive_bodies(rules, [body or [] for body in rules.bodies])
    cycle = _left_cycle(bodies, _nullable(bodies))
    if cycle:
        _left_recursion(rules, cycle)
    return bodies


def _productive_bodies(rules: Rules, bodies: list[list[Alternative]]) -> list[list[Alternative]]:
    """Bodies without the alternatives that can never finish; a named rule left with none is an error."""
    productive = _closure(bodies, terminals=True)
    for name, rule in rules.ids.items():
        if not productive[rule]:
            raise rules.invalid(rules.offsets[rule], f"rule '{name}' matches no finite text")
    return [
        [
            alt
            for alt in body
            if all(value != 0 if kind == TERMINAL else productive[value] for kind, value in alt)
        ]
        for body in bodies
    ]


def _nullable(bodies: list[list[Alternative]]) -> list[bool]:
    return _closure(bodies, terminals=False)


def _closure(bodies: list[list[Alternative]], terminals: bool) -> list[bool]:
    """The rules with an alternative whose references all lead to such rules and whose terminals
    match a byte (`terminals`; else that holds no terminal): which rules finish, or can match
    nothing. Worked from the rules found, each reference visited once (linear in the grammar: a
    DFA of thousands of states is a chain of thousands of rules)."""
    found = [False] * len(bodies)
    waiting: list[list[int]] = []  # per alternative: [its rule, the references not found yet]
    users: list[list[int]] = [[] for _ in bodies]  # per rule: the alternatives referring to it
    ready = []
    for rule, body in enumerate(bodies):
        for alt in body:
            if any(kind == TERMINAL and (not terminals or value == 0) for kind, value in alt):
                continue
            refs = [value for kind, value in alt if kind != TERMINAL]
            for value in refs:
                users[value].append(len(waiting))
            waiting.append([rule, len(refs)])
            if not refs:
                ready.append(rule)
    while ready:
        rule = ready.pop()
        if found[rule]:
            continue
        found[rule] = True
        for user in users[rule]:
            waiting[user][1] -= 1
            if waiting[user][1] == 0:
                ready.append(waiting[user][0])
    return found


def _left_cycle(bodies: list[list[Alternative]], nullable: list[bool]) -> list[int]:
    """A cycle of rules each of which can start with the next, or [] when there is none."""
    edges: list[list[int]] = []
    for body in bodies:
        firsts = []
        for alt in body:
            for kind, value in alt:
                if kind != REF:
                    break
                firsts.append(value)
                if not nullable[value]:
                    break
        edges.append(firsts)
    color = [0] * len(bodies)  # 0 unseen, 1 on the path, 2 done
    for top in range(len(bodies)):
        if color[top]:
            continue
        path, pending = [top], [iter(edges[top])]
        color[top] = 1
        while path:
            nxt = next(pending[-1], None)
            if nxt is None:
                color[path.pop()] = 2
                pending.pop()
            elif color[nxt] == 1:
                return path[path.index(nxt) :]
            elif color[nxt] == 0:
                color[nxt] = 1
                path.append(nxt)
                pending.append(iter(edges[nxt]))
    return []


def _left_recursion(rules: Rules, cycle: list[int]) -> NoReturn:
    if all(rule in rules.repeats for rule in cycle):
        raise rules.invalid(
            rules.offsets[cycle[0]], "a repetition of something that can match nothing (left recursion)"
        )
    named = [rule for rule in cycle if rules.ids.get(rules.names[rule]) == rule] or cycle
    names = " -> ".join(rules.names[rule] for rule in [*cycle, cycle[0]])
    raise rules.invalid(
        rules.offsets[named[0]],
        f"rule '{rules.names[named[0]]}' is left-recursive "
        f'({names}); rewrite it with repetition, as in a ::= b ("+" b)*',
    )
