"""The string formats JSON Schema constraints enforce, as regexes over a string's characters
(regex.py's syntax), with each format's shortest and longest string: json_values.string_format
compiles them, json_schema.py weighs length bounds against FORMAT_LENGTHS. Any other format is an
annotation.
"""

from __future__ import annotations

# February 29th in the leap years of the Gregorian calendar: divisible by 4, centuries by 400.
_LEAP_YEAR = r"(?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)"
_DATE = (
    r"(?:\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
    rf"|02-(?:0[1-9]|1\d|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
# Up to nanoseconds (RFC 3339 allows any number of fraction digits; Go's RFC3339Nano and Kubernetes
# write up to 9): the longest string stays bounded.
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_ATOM_CHAR = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_ATOM = rf"{_ATOM_CHAR}+"
# A DNS label (RFC 1123): letters, digits and inner hyphens, 63 at most; none with hyphens 3rd and 4th
# (RFC 5891: "xn--" starts an A-label, whose Punycode a regex cannot check; the others are reserved).
_LABEL = (
    r"[A-Za-z0-9](?:[A-Za-z0-9-]?[A-Za-z0-9])?"
    r"|[A-Za-z0-9][A-Za-z0-9-](?:[A-Za-z0-9][A-Za-z0-9-]{0,59}[A-Za-z0-9]|-[A-Za-z0-9](?:[A-Za-z0-9-]{0,58}[A-Za-z0-9])?)"
)
_LABEL = f"(?:{_LABEL})"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
# RFC 3986's grammar: scheme, authority (userinfo, host, port), path, query and fragment, each of
# the characters it may hold (%HH escapes well formed), an IP literal an IPv6 address (or IPvFuture).
# An IRI (RFC 3987) adds the non-ASCII characters it allows.
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*"
_H16 = r"[0-9A-Fa-f]{1,4}"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_LS32 = f"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6 = "|".join(
    [
        f"(?:{_H16}:){{6}}{_LS32}",
        f"::(?:{_H16}:){{5}}{_LS32}",
        f"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
        f"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
        f"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
        f"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
        f"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
        f"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
        f"(?:(?:{_H16}:){{0,6}}{_H16})?::",
    ]
)
_UCS = "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef"


def _uri(reference: bool, iri: bool) -> str:
    unreserved = "A-Za-z0-9\\-._~" + (_UCS if iri else "")
    plain = f"(?:[{unreserved}!$&'()*+,;=]|%[0-9A-Fa-f]{{2}})"  # unreserved, sub-delims, %HH
    pchar = f"(?:{plain}|[:@])"
    segment, nonempty = f"{pchar}*", f"{pchar}+"
    literal = f"\\[(?:{_IPV6}|v[0-9A-Fa-f]+\\.(?:{plain}|:)+)\\]"  # an IP literal: IPv6 or IPvFuture
    authority = f"(?:(?:{plain}|:)*@)?(?:{literal}|{plain}*)(?::\\d*)?"
    after = f"(?:\\?(?:{pchar}|[/?])*)?(?:#(?:{pchar}|[/?])*)?"
    hier = f"(?://{authority}(?:/{segment})*|/(?:{nonempty}(?:/{segment})*)?|{nonempty}(?:/{segment})*|)"
    absolute = f"{_SCHEME}:{hier}{after}"
    if not reference:
        return absolute
    no_colon = f"(?:{plain}|@)+"  # a relative path's first segment holds no ":" (it would be a scheme)
    relative = (
        f"(?://{authority}(?:/{segment})*|/(?:{nonempty}(?:/{segment})*)?|{no_colon}(?:/{segment})*|){after}"
    )
    return f"(?:{absolute}|{relative})"


# RFC 6570: literal characters and {expressions} of an optional operator and variables.
_VARNAME = r"(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})(?:\.?(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2}))*"
_VARSPEC = f"{_VARNAME}(?::[1-9]\\d{{0,3}}|\\*)?"
_URI_TEMPLATE = (
    f"(?:[!#$&()*+,\\-./0-9:;=?@A-Z\\[\\]_a-z~{_UCS}]|%[0-9A-Fa-f]{{2}}"
    f"|\\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*"
)
_DURATION_TIME = r"T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)"
_DURATION = rf"P(?:(?:\d+D|\d+M(?:\d+D)?|\d+Y(?:\d+M(?:\d+D)?)?)(?:{_DURATION_TIME})?|{_DURATION_TIME}|\d+W)"


def _regex_syntax(depth: int) -> str:
    """A regex's syntax as every dialect JSON Schema users write (ECMA-262, Python, PCRE) shares
    it, read leniently: alternatives of pieces, a piece an atom (a character, an escape, a class,
    a group) with a quantifier (`*` `+` `?` `{n}` `{n,}` `{n,m}`, then `?` or `+`), a group's
    opening `(?...` prefix (`(?:`, `(?=`, `(?<name>`, flags) taken as it comes. Refused: a
    quantifier with nothing before it (`*`, `a|+`, `a**`), a `\\` at the end, `(` or `[` left
    open, a `)` with none open, an empty class. Groups nest `depth` deep (a regular language
    counts that far)."""
    char = r"[^\\()\[|*+?]"  # `]`, `{`, `}` and anchors are atoms of their own
    escape = r"\\[\s\S]"
    # A class: `[`, `^`, a `]` taken as itself right after them, then anything but an unescaped `]`:
    # one reading of each class (two would have the automaton follow two depths at once).
    inside, first = r"(?:[^\\\]]|\\[\s\S])", r"(?:[^\\\]^]|\\[\s\S])"
    klass = rf"\[(?:\^(?:\]|{inside})|\]|{first}){inside}*\]"  # never empty: `[]` is not a class
    quantifier = r"(?:[*+?]|\{\d+(?:,\d*)?\})[?+]?"
    sequence = rf"(?:(?:{char}|{escape}|{klass})(?:{quantifier})?|\|)*"  # alternatives: pieces and `|`s
    for _ in range(depth):
        group = rf"\((?:\?[:=!<>A-Za-z0-9_'-]*)?{sequence}\)"
        sequence = rf"(?:(?:{char}|{escape}|{klass}|{group})(?:{quantifier})?|\|)*"
    return sequence


MAX_REGEX_GROUP_DEPTH = 10

# February stops at the 28th but in leap years, and seconds at 59: every date written is a real one.
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "email": rf"{_ATOM}(?:\.{_ATOM})*@{_LABEL}(?:\.{_LABEL})+",
    "ipv4": _IPV4,
    "hostname": rf"{_LABEL}(?:\.{_LABEL})*",
    "ipv6": _IPV6,
    "uri": _uri(reference=False, iri=False),
    "uri-reference": _uri(reference=True, iri=False),
    "iri": _uri(reference=False, iri=True),
    "iri-reference": _uri(reference=True, iri=True),
    "uri-template": _URI_TEMPLATE,
    "duration": _DURATION,
    "regex": _regex_syntax(MAX_REGEX_GROUP_DEPTH),
}


# Each format's shortest and longest string in characters (None: no longest); all are ASCII.
FORMAT_LENGTHS: dict[str, tuple[int, int | None]] = {
    "date": (10, 10),
    "time": (9, 24),  # 12:00:00Z .. 12:00:00.123456789+01:00
    "date-time": (20, 35),
    "uuid": (36, 36),
    "email": (5, None),  # a@b.c
    "ipv4": (7, 15),
    "hostname": (1, None),
    "ipv6": (2, 45),  # :: .. ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255
    "uri": (2, None),  # a:
    "uri-reference": (0, None),
    "iri": (2, None),
    "iri-reference": (0, None),
    "uri-template": (0, None),
    "duration": (3, None),  # P1D
    "regex": (0, None),
}


def short_email(most: int) -> str:
    """Emails of at most `most` (5 or more) characters, where the format's automaton with that
    bound passes the state limit: a subset whose parts are bounded apart, so no counter spans the
    whole. Up to 3 dot-separated atoms of the local part (a third of the length, 64 at most), then
    2 to 4 labels (no hyphen third, so no `xn--`), the rest of the length shared among them."""
    local = min(64, (most - 1) // 3)
    atom = (local - 2) // 3
    local_part = (
        rf"{_ATOM_CHAR}{{1,{atom}}}(?:\.{_ATOM_CHAR}{{1,{atom}}}){{0,2}}"
        if atom >= 1
        else rf"{_ATOM_CHAR}{{1,{local}}}"
    )
    domain = most - 1 - local
    labels = 4 if (domain - 3) // 4 >= 4 else 2
    width = min(63, (domain - (labels - 1)) // labels)
    label = (
        rf"[A-Za-z0-9]{{1,2}}(?:[A-Za-z0-9][A-Za-z0-9-]{{0,{width - 4}}}[A-Za-z0-9]|[A-Za-z0-9])?"
        if width >= 4
        else rf"[A-Za-z0-9]{{1,{width}}}"
    )
    return rf"{local_part}@{label}(?:\.{label}){{1,{labels - 1}}}"
