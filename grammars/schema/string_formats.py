"""Regexes for JSON Schema string `format`s, over the string body (between the quotes).

Each regex accepts a subset of the format's valid strings that is easy for a model to hit (for
example only `T` and `Z` in date-times, no leading zeros in IPv4, bounded label lengths in
hostnames; ASCII forms for iri and idn-*): the grammar may be stricter than the format, never
looser. `regex` (not a regular language) is relaxed by the caller; a format that no JSON Schema
draft 4-2020-12 defines (`FORMAT_NAMES`) is an annotation, which validators ignore, and is not listed.
Every regex is plain ASCII without `"` or `\\`, so it reads the same escaped or not.
"""

from __future__ import annotations

_YEAR = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"  # 0001..9999
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DAY_31 = "(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
_DAY_30 = "(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
_DAY_FEB = "02-(?:0[1-9]|1[0-9]|2[0-8])"
DATE = f"(?:{_YEAR}-(?:{_DAY_31}|{_DAY_30}|{_DAY_FEB})|{_LEAP_YEAR}-02-29)"
_HOUR_MIN = "(?:[01][0-9]|2[0-3]):[0-5][0-9]"
TIME = f"{_HOUR_MIN}:[0-5][0-9](?:\\.[0-9]{{1,6}})?(?:Z|[+-]{_HOUR_MIN})"
DATE_TIME = f"{DATE}T{TIME}"
_HEX = "[0-9a-fA-F]"
UUID = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
IPV4 = f"{_OCTET}(?:\\.{_OCTET}){{3}}"
_H = f"{_HEX}{{1,4}}"
IPV6 = "|".join(
    [
        f"(?:{_H}:){{7}}{_H}",
        f"(?:{_H}:){{1,7}}:",
        f"(?:{_H}:){{1,6}}:{_H}",
        f"(?:{_H}:){{1,5}}(?::{_H}){{1,2}}",
        f"(?:{_H}:){{1,4}}(?::{_H}){{1,3}}",
        f"(?:{_H}:){{1,3}}(?::{_H}){{1,4}}",
        f"(?:{_H}:){{1,2}}(?::{_H}){{1,5}}",
        f"{_H}:(?::{_H}){{1,6}}",
        f":(?:(?::{_H}){{1,7}}|:)",
    ]
)
_LABEL = "[a-zA-Z0-9]{1,20}(?:-[a-zA-Z0-9]{1,10}){0,3}"  # no "--" (IDNA reserves it at 3-4)
HOSTNAME = f"{_LABEL}(?:\\.{_LABEL}){{0,3}}"
_DOMAIN = f"(?:{_LABEL}\\.){{1,3}}[a-zA-Z]{{2,12}}"
_LOCAL_ATOM = "[a-zA-Z0-9_%+-]{1,20}"  # three atoms and two dots stay within 64
EMAIL = f"{_LOCAL_ATOM}(?:\\.{_LOCAL_ATOM}){{0,2}}@{_DOMAIN}"
# RFC 3986 section 3 and 4.1, in full but for IPvFuture hosts: scheme ":" hier-part ["?" query]
# ["#" fragment], any scheme; hier-part is "//" authority path-abempty (the host may be empty:
# file:///etc), or a path that is absolute, rootless (urn:isbn:0451450523, mailto:a@b) or empty.
# A host is a reg-name or a bracketed IPv6 literal. Nothing is bounded: jsonschema-rs checks the
# syntax alone (no length, label or port range), and bounded repetitions of overlapping character
# sets (userinfo, host, labels) multiply into thousands of DFA states (4444 for the bounded form).
_PCT = "%[0-9a-fA-F]{2}"
_SUB = "a-zA-Z0-9._~!$&'()*+,;="  # unreserved and sub-delims; each class below ends in "-"
_REG_CHAR = f"(?:[{_SUB}-]|{_PCT})"
_PCHAR = f"(?:[{_SUB}:@-]|{_PCT})"
_SCHEME = "[a-zA-Z][a-zA-Z0-9+.-]*"
_HOST = f"(?:{_REG_CHAR}*|\\[(?:{IPV6})\\])"
_AUTHORITY = f"(?:(?:[{_SUB}:-]|{_PCT})*@)?{_HOST}(?::[0-9]*)?"
_ABEMPTY = f"(?:/{_PCHAR}*)*"
_ROOTLESS = f"{_PCHAR}+{_ABEMPTY}"
_NET_OR_ABSOLUTE = f"//{_AUTHORITY}{_ABEMPTY}|/(?:{_ROOTLESS})?"
_QUERY_FRAGMENT = f"(?:\\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
URI = f"{_SCHEME}:(?:{_NET_OR_ABSOLUTE}|{_ROOTLESS})?{_QUERY_FRAGMENT}"
# relative-ref: as hier-part, but a rootless path's first segment has no ":" (path-noscheme).
_RELATIVE_REF = f"(?:{_NET_OR_ABSOLUTE}|(?:[{_SUB}@-]|{_PCT})+{_ABEMPTY})?{_QUERY_FRAGMENT}"
URI_REFERENCE = f"(?:{URI}|{_RELATIVE_REF})"

# RFC 3339 appendix A: "P" (dur-date / dur-time / dur-week); each unit at most once, in order.
_N = "[0-9]+"
_DUR_TIME = f"T(?:{_N}H(?:{_N}M(?:{_N}S)?)?|{_N}M(?:{_N}S)?|{_N}S)"
_DUR_DATE = f"(?:{_N}D|{_N}M(?:{_N}D)?|{_N}Y(?:{_N}M(?:{_N}D)?)?)(?:{_DUR_TIME})?"
DURATION = f"P(?:{_DUR_DATE}|{_DUR_TIME}|{_N}W)"
# RFC 6901: ("/" *(unescaped / "~0" / "~1"))*, unescaped here printable ASCII but " / \ ~.
_POINTER_CHAR = "[\\x20\\x21\\x23-\\x2e\\x30-\\x5b\\x5d-\\x7d]"
JSON_POINTER = f"(?:/(?:{_POINTER_CHAR}|~[01])*)*"
RELATIVE_JSON_POINTER = f"(?:0|[1-9][0-9]*)(?:#|{JSON_POINTER})"
# RFC 6570 levels 1-4 with the level 2-3 operators: literals (ASCII, pct-encoded) and
# expressions "{" [op] varspec *("," varspec) "}", varspec = varname [":" 1-9999 / "*"].
_VARCHAR = f"(?:[a-zA-Z0-9_]|{_PCT})"
_VARSPEC = f"{_VARCHAR}(?:\\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\\*)?"
_TEMPLATE_LITERAL = "[!#$&()*+,./0-9:;=?@A-Z\\[\\]_a-z~-]"
URI_TEMPLATE = f"(?:{_TEMPLATE_LITERAL}|{_PCT}|\\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*"

STRING_FORMATS: dict[str, str] = {
    "date": DATE,
    "time": TIME,
    "date-time": DATE_TIME,
    "uuid": UUID,
    "ipv4": IPV4,
    "ipv6": IPV6,
    "hostname": HOSTNAME,
    "email": EMAIL,
    "uri": URI,
    "uri-reference": URI_REFERENCE,
    "iri": URI,  # an ASCII IRI is a URI
    "iri-reference": URI_REFERENCE,
    "idn-hostname": HOSTNAME,
    "idn-email": EMAIL,
    "duration": DURATION,
    "json-pointer": JSON_POINTER,
    "relative-json-pointer": RELATIVE_JSON_POINTER,
    "uri-template": URI_TEMPLATE,
}

# Formats whose validity bounds the length of their parts (a hostname label at most 63
# characters, an email's local part at most 64): with counters (GrammarOptions.counted_lengths)
# they are written with free repetitions under a maximum total length that implies every part's
# bound, which the string's counter enforces (grammars/counted.py) alongside any maxLength of the
# schema's: a few states instead of the bounded forms above (email: 9 states and a 0.9 MB table
# for Llama-3's vocabulary, was 264 states, 46 MB and seconds of token walk). Stricter than the
# format (a hostname of 64-253 characters is not written), never looser. Without counters, or
# under a minLength above the cap, STRING_FORMATS' bounded forms are used.
_FREE_LABEL = "[a-zA-Z0-9]+(?:-[a-zA-Z0-9]+)*"  # no "--", as _LABEL
_FREE_HOSTNAME = f"{_FREE_LABEL}(?:\\.{_FREE_LABEL})*"
_FREE_EMAIL = f"[a-zA-Z0-9_%+-]+(?:\\.[a-zA-Z0-9_%+-]+)*@(?:{_FREE_LABEL}\\.)+[a-zA-Z]{{2,}}"
COUNTED_FORMATS: dict[str, tuple[str, int]] = {
    "hostname": (_FREE_HOSTNAME, 63),  # every label within 63, the name within 253
    "idn-hostname": (_FREE_HOSTNAME, 63),
    "email": (_FREE_EMAIL, 64),  # the local part within 64, each label within 63
    "idn-email": (_FREE_EMAIL, 64),
}

# The formats JSON Schema drafts 4 to 2020-12 define: only these can fail validation (draft 3's
# color, phone, ... are unknown to draft 4 and later validators).
FORMAT_NAMES = frozenset({*STRING_FORMATS, "regex"})
# Formats whose regex above is the whole format, not a subset (the hyphenated hex of RFC 4122; dotted
# decimal octets without leading zeros, as Python's ipaddress and ECMA validators read IPv4): only
# these are complemented (`not`, a oneOf's other branches), where a subset's complement would be looser.
EXACT_FORMATS = frozenset({"uuid", "ipv4"})


def format_leaf(name: str) -> tuple[str, str]:
    """A format of STRING_FORMATS as a string-expression leaf (schema/string_automaton.py): its regex
    anchored, read as a pattern (plain ASCII without `"` or `\\`, it means the same there)."""
    return ("pat", f"^(?:{STRING_FORMATS[name]})$")
