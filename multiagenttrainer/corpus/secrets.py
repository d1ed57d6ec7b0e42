"""Secret redaction: a documented rule set behind a literal pre-filter.

Every rule lists literal strings ("triggers") that any secret it finds contains. One
Aho-Corasick pass (ahocorasick_rs, SIMD-accelerated) finds all triggers of a file; a file
without any costs nothing more. Each hit runs only its own rule, and only at the hit: token
rules match at the hit's position; assignment rules first check that an assignment follows the
name (one short regex), then match the name and its value from where the name starts. The
secret value is replaced by `<REDACTED:rule>`; the rest of the line is kept.

Rules (name: what is redacted):
  private-key         the body of a -----BEGIN ... PRIVATE KEY----- block (BEGIN/END lines kept)
  aws-access-key      AKIA... / ASIA... access key ids (20 characters)
  github-token        ghp_, gho_, ghu_, ghs_, ghr_ tokens and github_pat_ fine-grained tokens
  slack-token         xoxa-, xoxb-, xoxp-, xoxo-, xoxr-, xoxs- tokens
  slack-webhook       the secret path of https://hooks.slack.com/services/...
  google-api-key      AIza... keys (39 characters)
  stripe-key          sk_live_ / rk_live_ keys
  jwt                 three base64url parts: eyJ....eyJ....signature
  url-credentials     the password in scheme://user:password@host
  aws-secret-key      a 40-character value assigned to aws_secret_access_key, SecretAccessKey, ...
  secret-assignment   a value assigned with `=`, `:`, `:=` or `=>` (code, YAML, JSON, .env, INI,
                      connection strings) to a name ending in password, passwd, pwd, secret,
                      secret_key, private_key, or _pass/-pass: any literal; or ending in token,
                      api_key/apikey, access_key, auth_key: a literal that looks generated (8+
                      characters without spaces, with both letters and digits)

Names are found in the spellings the triggers cover: lower, UPPER, Capitalised and camelCase
(`apiKey`); `pass` only as a suffix (`DB_PASS`, `smtp-pass`); names ending in token only when a
quote or the assignment directly follows (`token = ...`, `"token": ...`).

Placeholders are left alone: values under 4 characters, `${VAR}`, `$(cmd)`, `<...>`, `{{...}}`,
`{name}`, `%(x)s`, masks such as `****` or `xxxx`, and words or parts such as changeme, example,
your_token_here, dummy, redacted (so AWS's documented ...EXAMPLE keys stay). For unquoted values,
code is left alone too: calls, indexing, attribute access (`self.token`, `os.environ[...]`),
numbers, type names, and variables named like a secret (`password = new_password`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ahocorasick_rs import MATCHKIND_LEFTMOST_LONGEST, BytesAhoCorasick

Span = tuple[int, int, str]  # start, end, rule name
Hits = list[tuple[int, int, int]]  # (trigger, start, end) as SCANNER.find_matches_as_indexes gives them
SeenNames = set[tuple[int, str]]  # (name start, rule name) already looked at
Collector = Callable[["Rule", bytes, int, int, list[Span], SeenNames], None]

# ------------------------------------------------------------------ placeholders

PLACEHOLDER_WORDS = frozenset(
    b"none null nil true false undefined changeme change_me password passwd secret token apikey "
    b"api_key example sample placeholder dummy redacted test testing todo tbd fixme string str "
    b"int bool bytes any optional required empty default value mask masked hidden".split()
)
PLACEHOLDER_PARTS = (b"your", b"example", b"placeholder", b"redacted", b"changeme", b"dummy", b"xxxx")
QUOTED_PLACEHOLDER = re.compile(rb"\$\{|\$\(|\{\{|%\(|%s$|<[^>]*>$|\{[^}]*\}$")
BARE_PLACEHOLDER_STARTS = frozenset(b"$%<{[(@*#!&")
MASK_BYTES = frozenset(b"x*.-#_ ")
SECRET_WORDS = (b"password", b"passwd", b"pwd", b"secret", b"token", b"key", b"pass")
CODE_PATH = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
GENERATED_LOOKING = re.compile(rb"(?=[^\s]*[0-9])(?=[^\s]*[A-Za-z])[^\s]{8,}")
MIN_SECRET_LENGTH = 4
MAX_FAST_TRIGGERS = (
    64  # ahocorasick_rs searches with SIMD (Teddy) up to this many patterns, 7x slower past it
)


def is_placeholder(value: bytes, *, quoted: bool = True) -> bool:
    """Whether a value is obviously not a real secret."""
    value = value.strip()
    lowered = value.lower()
    if len(value) < MIN_SECRET_LENGTH:
        return True
    templated = QUOTED_PLACEHOLDER.match(value) if quoted else value[0] in BARE_PLACEHOLDER_STARTS
    if templated or lowered in PLACEHOLDER_WORDS or set(lowered) <= MASK_BYTES:
        return True
    if any(part in lowered for part in PLACEHOLDER_PARTS):
        return True
    return not quoted and looks_like_code(value, lowered)


def looks_like_code(value: bytes, lowered: bytes) -> bool:
    """An unquoted value that is an expression rather than a literal."""
    if any(c in value for c in b"()[]") or value.isdigit():
        return True
    if CODE_PATH.fullmatch(value) is None:
        return False
    return b"." in value or any(word in lowered for word in SECRET_WORDS)


# ------------------------------------------------------------------ rules


@dataclass(frozen=True)
class Rule:
    """A kind of secret: where the pre-filter triggers, how to find the value, what replaces it."""

    name: str
    triggers: tuple[bytes, ...]
    pattern: re.Pattern[bytes]
    collect: Collector
    offset: int = 0  # token rules: where the token starts relative to the trigger
    word_start: bool = True  # token rules: the token may not continue a longer word
    requires: bytes = b""  # a byte every match contains: in a file without it, hits are not looked at
    marker: bytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "marker", b"<REDACTED:" + self.name.encode() + b">")


def collect_token(rule: Rule, data: bytes, start: int, end: int, spans: list[Span], _seen: SeenNames) -> None:
    """A self-describing token at the trigger (shifted by the rule's offset)."""
    begin = start + rule.offset
    if begin < 0 or (rule.word_start and begin > 0 and data[begin - 1 : begin].isalnum()):
        return
    match = rule.pattern.match(data, begin)
    if match is None:
        return
    secret = match.span("secret") if "secret" in rule.pattern.groupindex else match.span()
    if not is_placeholder(data[secret[0] : secret[1]]):
        spans.append((secret[0], secret[1], rule.name))


ASSIGNMENT_FOLLOWS = re.compile(rb"""[A-Za-z0-9_-]{0,32}["']?[ \t]*(?::=|=>|=(?!=)|:(?![:=]))""")
NAME_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
MAX_NAME_BYTES = 64
VALUE_GROUPS = ("secret", "dq", "sq", "bq", "bare")


def name_start(data: bytes, start: int) -> int:
    """Where the name that holds the trigger at `start` begins."""
    lowest = max(0, start - MAX_NAME_BYTES)
    while start > lowest and data[start - 1] in NAME_BYTES:
        start -= 1
    return start


def collect_assignment(
    rule: Rule, data: bytes, start: int, end: int, spans: list[Span], seen: SeenNames
) -> None:
    """The value assigned to the name that holds the trigger, if it is assigned one here."""
    if ASSIGNMENT_FOLLOWS.match(data, start) is None:
        return  # `tokenizer.encode(...)`, `if password:`, prose: nothing assigned here
    begin = name_start(data, start)
    if (begin, rule.name) in seen:
        return
    seen.add((begin, rule.name))
    line_end = data.find(b"\n", start)
    line_end = len(data) if line_end == -1 else line_end
    match = rule.pattern.match(data, begin, line_end)
    if match is None:
        return
    group = next(g for g in VALUE_GROUPS if g in rule.pattern.groupindex and match.start(g) != -1)
    if is_assigned_secret(match, group, data[match.end() : line_end]):
        spans.append((match.start(group), match.end(group), rule.name))


def is_assigned_secret(match: re.Match[bytes], group: str, rest_of_line: bytes) -> bool:
    """Whether an assignment's value is a secret rather than a placeholder, code or prose."""
    value = match.group(group)
    if is_placeholder(value, quoted=group != "bare"):
        return False
    if group == "bare" and match.group("op") == b":" and rest_of_line.strip()[:1] not in (b"", b"#"):
        return False  # `name: words and more words` is prose or a type annotation, not YAML
    weak_name = "weak" in match.re.groupindex and match.group("weak") is not None
    return not weak_name or GENERATED_LOOKING.fullmatch(value) is not None


NOT_BASE64 = re.compile(rb"[^A-Za-z0-9+/=]")
MIN_KEY_BODY_CHARS = 32


def collect_key_block(
    rule: Rule, data: bytes, start: int, end: int, spans: list[Span], _seen: SeenNames
) -> None:
    """The body of a PEM private key block whose BEGIN line holds the trigger."""
    begin = data.rfind(b"-----BEGIN", max(0, start - 64), start)
    match = rule.pattern.match(data, begin) if begin != -1 else None
    if match is None:
        return
    body = match.group("secret")
    if len(NOT_BASE64.sub(b"", body)) < MIN_KEY_BODY_CHARS:
        return  # a mention of the format, or an empty template
    inner_start = match.start("secret") + body.find(body.strip())
    spans.append((inner_start, inner_start + len(body.strip()), rule.name))


OPERATOR = rb"""["']?[ \t]*(?P<op>:=|=>|=(?!=)|:(?![:=]))[ \t]*"""
VALUE = (  # a double-, single- or back-quoted string (escapes allowed), or a bare word
    rb"""(?:"(?P<dq>(?:[^"\\\n]|\\.)*)"|'(?P<sq>(?:[^'\\\n]|\\.)*)'"""
    rb"""|`(?P<bq>[^`\n]*)`|(?P<bare>[^\s"'`,;)\]}<>]+))"""
)
STRONG_NAME = rb"password|passwd|pwd|secret|secret[_-]?key|private[_-]?key|(?<=[_-])pass"
WEAK_NAME = rb"token|api[_-]?key|access[_-]?key|auth[_-]?key"
NAME_START = rb"(?<![A-Za-z0-9_.:/-])[A-Za-z0-9_.-]*?"
AWS_SECRET_NAME = rb"(?:(?:aws[_-]?)?secret[_-]?access[_-]?key|aws[_-]?secret[_-]?key)"

# Triggers for names are fragments that cover their spellings (`assw`: password, Password, passwd;
# `piKey`: apiKey, ApiKey). The automaton stays SIMD-fast only up to 64 triggers in all.
# "token" is everywhere in code (tokenizers, parsers, pagination), so it triggers only when a
# quote or an assignment follows it.
SECRET_TRIGGERS = (b"ecret", b"ECRET")
ASSIGNMENT_TRIGGERS = (
    SECRET_TRIGGERS
    + (
        b"assw",
        b"ASSW",
        b"pwd",
        b"Pwd",
        b"PWD",
        b"_pass",
        b"_PASS",
        b"_Pass",
        b"-pass",
        b"pi_key",
        b"PI_KEY",
        b"pi-key",
        b"PI-KEY",
        b"pikey",
        b"PIKEY",
        b"piKey",
        b"ccess_key",
        b"CCESS_KEY",
        b"ccess-key",
        b"ccessKey",
        b"rivate_key",
        b"RIVATE_KEY",
        b"rivateKey",
        b"uth_key",
        b"UTH_KEY",
        b"uthKey",
    )
    + tuple(word + end for word in (b"oken", b"OKEN") for end in (b'"', b"'", b"=", b" =", b":", b" :"))
)

RULES: tuple[Rule, ...] = (
    Rule(
        "private-key",
        (b"PRIVATE KEY",),
        re.compile(
            rb"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?P<secret>.*?)"
            rb"(?=-----END[A-Z0-9 ]*PRIVATE KEY|\Z)",
            re.S,
        ),
        collect_key_block,
    ),
    Rule(
        "aws-access-key",
        (b"AKIA", b"ASIA"),
        re.compile(rb"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
        collect_token,
    ),
    Rule(
        "github-token",
        (b"ghp_", b"gho_", b"ghu_", b"ghs_", b"ghr_", b"github_pat_"),
        re.compile(rb"(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})(?![A-Za-z0-9_])"),
        collect_token,
    ),
    Rule("slack-token", (b"xox",), re.compile(rb"xox[abposr]-[A-Za-z0-9-]{10,}"), collect_token),
    Rule(
        "slack-webhook",
        (b"hooks.slack.com",),
        re.compile(rb"hooks\.slack\.com/(?:services|workflows|triggers)/(?P<secret>[A-Za-z0-9_/+-]{8,})"),
        collect_token,
    ),
    Rule("google-api-key", (b"AIza",), re.compile(rb"AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])"), collect_token),
    Rule("stripe-key", (b"_live_",), re.compile(rb"[sr]k_live_[0-9A-Za-z]{10,}"), collect_token, offset=-2),
    Rule(
        "jwt",
        (b"eyJ",),
        re.compile(rb"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
        collect_token,
    ),
    Rule(
        "url-credentials",
        (b"://",),
        re.compile(rb"""://[^\s:/?#@"'`<>\\]{1,256}:(?P<secret>[^\s/?#@"'`<>\\]{1,256})@"""),
        collect_token,
        word_start=False,
        requires=b"@",  # URLs are everywhere in code and docs; ones with credentials are rare
    ),
    Rule(
        "aws-secret-key",
        SECRET_TRIGGERS,
        re.compile(
            rb"(?i)"
            + NAME_START
            + AWS_SECRET_NAME
            + OPERATOR
            + rb"""["']?(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"""
        ),
        collect_assignment,
    ),
    Rule(
        "secret-assignment",
        ASSIGNMENT_TRIGGERS,
        re.compile(
            rb"(?i)"
            + NAME_START
            + rb"(?:"
            + STRONG_NAME
            + rb"|(?P<weak>"
            + WEAK_NAME
            + rb"))"
            + rb"(?![A-Za-z0-9_.-])"
            + OPERATOR
            + VALUE
        ),
        collect_assignment,
    ),
)
RULE_ORDER = {rule.name: index for index, rule in enumerate(RULES)}


def _build_scanner() -> tuple[BytesAhoCorasick, list[tuple[Rule, ...]]]:
    """One automaton over every trigger; each trigger maps to the rules it can start."""
    rules_for: dict[bytes, list[Rule]] = {}
    for rule in RULES:
        for trigger in rule.triggers:
            rules_for.setdefault(trigger, []).append(rule)
    triggers = list(rules_for)
    return BytesAhoCorasick(triggers, matchkind=MATCHKIND_LEFTMOST_LONGEST), [
        tuple(rules_for[t]) for t in triggers
    ]


SCANNER, TRIGGER_RULES = _build_scanner()


def _required_byte(rules: tuple[Rule, ...]) -> int:
    """The byte (as an int) every rule of a trigger requires in the file, or -1 when there is none."""
    needs = {rule.requires for rule in rules}
    return needs.pop()[0] if len(needs) == 1 and b"" not in needs else -1


# Per trigger: the byte its rules need somewhere in the file, or -1 (the native encoder reads this too).
TRIGGER_REQUIRES = tuple(_required_byte(rules) for rules in TRIGGER_RULES)
REQUIRED_BYTES = frozenset(required for required in TRIGGER_REQUIRES if required >= 0)


def relevant_hits(data: bytes, hits: Hits) -> Hits:
    """The hits whose rules could match in this file (e.g. no URL credentials in a file without `@`)."""
    missing = {byte for byte in REQUIRED_BYTES if data.find(byte) < 0}
    if not missing:
        return hits
    return [hit for hit in hits if TRIGGER_REQUIRES[hit[0]] not in missing]


def redact_secrets(data: bytes, hits: Hits | None = None) -> tuple[bytes, dict[str, int]]:
    """The data with every secret value replaced by `<REDACTED:rule>`, and how many per rule.

    `hits`: SCANNER's matches in data, when the caller has them already.
    """
    if hits is None:
        hits = SCANNER.find_matches_as_indexes(data)
    hits = relevant_hits(data, hits) if hits else hits
    if not hits:
        return data, {}
    spans: list[Span] = []
    seen: SeenNames = set()
    for trigger, start, end in hits:
        for rule in TRIGGER_RULES[trigger]:
            rule.collect(rule, data, start, end, spans, seen)
    if not spans:
        return data, {}
    return splice(data, spans)


def splice(data: bytes, spans: list[Span]) -> tuple[bytes, dict[str, int]]:
    """Replace non-overlapping spans; of overlapping ones the earliest wins, then the rule listed first."""
    pieces: list[bytes] = []
    counts: dict[str, int] = {}
    position = 0
    for start, end, name in sorted(set(spans), key=lambda s: (s[0], RULE_ORDER[s[2]], -s[1])):
        if start < position:
            continue
        pieces += [data[position:start], RULES[RULE_ORDER[name]].marker]
        counts[name] = counts.get(name, 0) + 1
        position = end
    pieces.append(data[position:])
    return b"".join(pieces), counts
