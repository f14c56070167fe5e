"""A syntax tree (pattern.py) as a grammar Program (gbnf.py's), run by the pushdown engine
(grammar.py): how a JSON Schema too large for a DFA, or recursive through `$ref`, is compiled.

The tree's size, not the language's, bounds the work: every node becomes a few elements once (a
node shared by several parents, such as a `$defs` entry used in many places, is one rule), and
the parser states are found lazily as rows reach them. `Ref(name)` nodes refer to the trees of a
table beside the root, so a schema can refer to itself at any depth.

Rules are built directly as gbnf_rules.py's alternatives, then checked as a GBNF text's would be:
a reference before any output that leads back to itself (left recursion) is SCHEMA_UNSUPPORTED,
a root that can never finish (required recursion without end) CONSTRAINT_UNSATISFIABLE, more than
`max_elements` elements CONSTRAINT_TOO_LARGE.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.constrain import utf8
from engine.constrain.gbnf import MAX_ELEMENTS, FreeMembers, Program, byte_alternatives, flatten
from engine.constrain.gbnf_rules import MEMBERS, REF, TERMINAL, Alternative, checked_bodies
from engine.constrain.pattern import Alt, Anchor, Chars, Machine, Members, Node, Ref, Repeat, Seq, Text
from engine.errors import InvalidInput

__all__ = ["program"]

ROOT = "root"


def program(root: Node, rules: Mapping[str, Node], field: str, max_elements: int = MAX_ELEMENTS) -> Program:
    """The Program matching exactly `root`'s strings, `Ref(name)` standing for `rules[name]`."""
    built = _Rules(rules, field, max_elements)
    body = built.body(root)
    built.bodies[built.ids[ROOT]] = [body]
    bodies = checked_bodies(built)
    if built.free:  # the stand-ins the checks read become the MEMBERS elements they stand for
        free = built.free
        bodies = [
            [[(MEMBERS, free[v]) if k == REF and v in free else (k, v) for k, v in alt] for alt in rule]
            for rule in bodies
        ]
    return flatten(bodies, built.ids[ROOT], tuple(built.free_members))


class _Rules:
    """The rules made so far, in the shape gbnf_rules.Rules reads (its checks name rules by index)."""

    def __init__(self, table: Mapping[str, Node], field: str, max_elements: int) -> None:
        self.table, self.field, self.max_elements = table, field, max_elements
        self.ids: dict[str, int] = {}
        self.names: list[str] = []
        self.bodies: list[list[Alternative] | None] = []
        self.offsets: list[int] = []
        self.repeats: set[int] = set()
        self.elements = 0
        self._made: dict[int, tuple[Node, int]] = {}  # id(node) -> (node, its rule): shared nodes once
        self._refs: dict[str, int] = {}
        self._classes: dict[tuple[tuple[int, int], ...], Alternative] = {}
        self.free: dict[int, int] = {}  # a free Members' stand-in rule -> its FreeMembers
        self.free_members: list[FreeMembers] = []
        self.ids[ROOT] = self.new(ROOT)

    def invalid(self, offset: int, message: str) -> InvalidInput:
        if "matches no finite text" in message:
            return InvalidInput(
                "the schema admits no finite JSON value (a required $ref recursion that never ends)",
                reason="CONSTRAINT_UNSATISFIABLE",
                field=self.field,
            )
        return InvalidInput(
            f"{self.names[offset]}: a $ref that leads back to itself before any output "
            "(left recursion) is not supported in JSON schema constraints",
            reason="SCHEMA_UNSUPPORTED",
            field=self.field,
        )

    def new(self, name: str, body: list[Alternative] | None = None) -> int:
        if body is not None:
            self._charge(body)
        self.names.append(name)
        self.bodies.append(body)
        self.offsets.append(len(self.names) - 1)  # the checks' "offset" of a rule: its index
        return len(self.names) - 1

    def define(self, rule: int, body: list[Alternative]) -> int:
        self._charge(body)
        self.bodies[rule] = body
        return rule

    def _charge(self, body: list[Alternative]) -> None:
        self.elements += sum(len(alt) + 1 for alt in body)
        if self.elements > self.max_elements:
            raise InvalidInput(
                f"the constraint compiles to more than {self.max_elements} grammar elements",
                reason="CONSTRAINT_TOO_LARGE",
                field=self.field,
            )

    def body(self, node: Node) -> Alternative:
        """`node` as one sequence of elements (its alternatives, repeats and members as rules)."""
        if isinstance(node, Text):
            return [(TERMINAL, 1 << byte) for byte in node.data]
        if isinstance(node, Seq):
            return [element for item in node.items for element in self.body(item)]
        if isinstance(node, Anchor):
            return []
        if isinstance(node, Chars):
            return self._chars(node)
        if isinstance(node, Ref):
            return [(REF, self._ref(node.name))]
        if isinstance(node, Machine):
            return [(REF, self._machine(node))]
        return [(REF, self._rule(node))]

    def _machine(self, node: Machine) -> int:
        """A rule per state: a byte then the target's rule, or nothing where the state accepts."""
        made = self._made.get(id(node))
        if made is not None:
            return made[1]
        rules = [self.new(f"machine_{len(self.names)}") for _ in node.accepting]
        self._made[id(node)] = (node, rules[0])
        for rule, moves, accepting in zip(rules, node.moves, node.accepting, strict=True):
            body: list[Alternative] = [
                [(TERMINAL, (1 << (hi + 1)) - (1 << lo)), (REF, rules[target])] for lo, hi, target in moves
            ]
            self.define(rule, body + ([[]] if accepting else []))
        return rules[0]

    def _ref(self, name: str) -> int:
        rule = self._refs.get(name)
        if rule is None:
            if name not in self.table:
                raise KeyError(f"no rule {name!r} beside the tree")
            rule = self._refs[name] = self.new(name)
            self.define(rule, [self.body(self.table[name])])
        return rule

    def _rule(self, node: Alt | Repeat | Members) -> int:
        made = self._made.get(id(node))
        if made is not None:
            return made[1]
        rule = self.new(f"{type(node).__name__.lower()}_{len(self.names)}")
        self._made[id(node)] = (node, rule)
        if isinstance(node, Alt):
            return self.define(rule, [self.body(item) for item in node.items] or [[(TERMINAL, 0)]])
        if isinstance(node, Repeat):
            return self.define(rule, self._repeat(node))
        return self.define(rule, self._members(node))

    def _repeat(self, node: Repeat) -> list[Alternative]:
        """x (sep x){lo-1, hi-1}, or nothing when lo is 0: nested optional rules for a bound, one
        right-recursive rule without (llama.cpp's rewrite, as gbnf.py's)."""
        item = self.body(node.item)
        step = ([] if node.separator is None else self.body(node.separator)) + item
        tail: Alternative = []
        if node.hi is None:
            loop = self.new(f"more_{len(self.names)}")
            self.repeats.add(loop)
            self.define(loop, [step + [(REF, loop)], []])
            tail = [(REF, loop)]
        else:
            for _ in range(node.hi - max(node.lo, 1)):
                optional = self.new(f"more_{len(self.names)}", [step + tail, []])
                self.repeats.add(optional)
                tail = [(REF, optional)]
        once = item + step * (max(node.lo, 1) - 1) + tail
        return [once, []] if node.lo == 0 else [once]

    def _members(self, node: Members) -> list[Alternative]:
        """An in-order subsequence holding the required items: from the last item back, `none[i]`
        (nothing written yet: no separator before item i) and `some[i]` (a separator first).
        Free items (any order) are a MEMBERS element (gbnf.FreeMembers) over rules of each item
        and of what follows them; the checks read it as the in-order rules (a stand-in rule),
        which finish, match nothing or recurse on the left exactly when it does (each free item
        starts with a byte; with `least`, the stand-in also matches the empty text: the checks are
        then stricter about left recursion, never looser)."""
        separator = self.body(node.separator)
        none: Alternative = []  # past the last item: nothing more
        some: Alternative = []
        rest = (none, some)
        # Free items are written in four places (the stand-in's two, the element's two): a rule each.
        bodies = [
            [(REF, self.new(f"member_{len(self.names)}", [self.body(item)]))]
            if node.free
            else self.body(item)
            for item in node.items
        ]
        for index in reversed(range(len(node.items))):
            if index + 1 == node.free:
                rest = (none, some)
            written = bodies[index]
            optional = not node.required[index]
            none_alts = [written + some] + ([none] if optional else [])
            some_alts = [separator + written + some] + ([some] if optional else [])
            none = [(REF, self.new(f"members_{len(self.names)}", none_alts))]
            some = [(REF, self.new(f"members_{len(self.names)}", some_alts))]
        if not node.free:
            return [none]
        loose = bodies[: node.free]
        free = FreeMembers(
            tuple(self.new(f"free_{len(self.names)}", [item]) for item in loose),
            tuple(self.new(f"free_{len(self.names)}", [separator + item]) for item in loose),
            sum(1 << i for i, required in enumerate(node.required[: node.free]) if required),
            self.new(f"free_rest_{len(self.names)}", [rest[0]]),
            self.new(f"free_rest_{len(self.names)}", [rest[1]]),
            node.least,
            sum(1 << i for i in range(node.free - node.again, node.free)),
            node.rules,
        )
        stand_in = self.new(f"free_{len(self.names)}", [none])
        self.free[stand_in] = len(self.free_members)
        self.free_members.append(free)
        return [[(REF, stand_in)]]

    def _chars(self, node: Chars) -> Alternative:
        found = self._classes.get(node.ranges)
        if found is None:
            alts = byte_alternatives(
                utf8.sequences(node.ranges), lambda body: self.new(f"chars_{len(self.names)}", body)
            )
            found = alts[0] if len(alts) == 1 else [(REF, self.new(f"chars_{len(self.names)}", alts))]
            self._classes[node.ranges] = found
        return found
